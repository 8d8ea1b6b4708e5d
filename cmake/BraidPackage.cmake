# The Debian package: `cpack -G DEB` in a build folder writes braid_<version>_<arch>.deb
# with everything BraidInstall.cmake installs, under /usr. Its Depends line comes from
# dpkg-shlibdeps (the libraries the binaries link: yaml-cpp, OpenBLAS, Boost, Open MPI, libstdc++).
set(BRAID_PACKAGE_CONTACT "braid developers" CACHE STRING "Maintainer field of the Debian package")
set(CPACK_PACKAGE_NAME braid)
set(CPACK_PACKAGE_VENDOR braid)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "planner and runtime for multimodal LLM training (C ABI, plugins, CLI)")
set(CPACK_PACKAGE_DESCRIPTION
    "braid plans per-submodule parallel layouts for multimodal LLMs (DistMM, Optimus, DistTrain), "
    "simulates their pipeline programs and runs them. This package holds libbraid.so (the C ABI), "
    "its headers, the plugin interface headers, the MPI and CUDA plugins where built, the braid CLI, "
    "and the CMake and pkg-config files for projects that use it.")
set(CPACK_PACKAGE_CONTACT "${BRAID_PACKAGE_CONTACT}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_GENERATOR DEB)
include(CPack)
