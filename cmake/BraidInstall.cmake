# Install rules: what `cmake --install` and the Debian package (BraidPackage.cmake) put
# where, and the files that let other projects find it:
#   <libdir>/libbraid.so.<release>, .so.<ABI>, .so    the C ABI (braid::braid)
#   <includedir>/braid/*.h                             its public headers
#   <includedir>/braid/plugins/braid_*_v<N>.h          the frozen plugin interfaces (braid::plugin_api)
#   <libdir>/braid/libbraid-<name>.so                  the plugins, where the loader looks
#   <bindir>/braid                                     the CLI (when built)
#   <libdir>/cmake/braid/                              braidConfig.cmake, its version file, the targets
#   <libdir>/pkgconfig/braid.pc                        pkg-config
include(CMakePackageConfigHelpers)
set(BRAID_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/braid)

install(TARGETS braid braid_plugin_api EXPORT braidTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY capi/include/braid DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY plugins/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/braid/plugins
  FILES_MATCHING PATTERN "braid_*.h")
foreach(_plugin braid-cuda braid-host braid-mpi braid-nccl)
  if(TARGET ${_plugin})
    install(TARGETS ${_plugin} LIBRARY DESTINATION ${BRAID_PLUGIN_INSTALL_DIR})
  endif()
endforeach()
if(TARGET braid_cli)
  install(TARGETS braid_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# find_package(braid 0.1): any 0.y release from 0.1 on (the ABI version, checked at run
# time with braid_abi_version(), is what decides binary compatibility).
install(EXPORT braidTargets NAMESPACE braid:: DESTINATION ${BRAID_CMAKE_INSTALL_DIR})
configure_package_config_file(cmake/braidConfig.cmake.in ${PROJECT_BINARY_DIR}/braidConfig.cmake
  INSTALL_DESTINATION ${BRAID_CMAKE_INSTALL_DIR}
  PATH_VARS BRAID_PLUGIN_INSTALL_DIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/braidConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/braidConfig.cmake ${PROJECT_BINARY_DIR}/braidConfigVersion.cmake
  DESTINATION ${BRAID_CMAKE_INSTALL_DIR})

# braid.pc finds its prefix from its own location, so an unpacked or moved tree works too.
file(RELATIVE_PATH BRAID_PC_PREFIX_FROM_PCFILEDIR ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" BRAID_PC_PREFIX_FROM_PCFILEDIR "${BRAID_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(cmake/braid.pc.in ${PROJECT_BINARY_DIR}/braid.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/braid.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
