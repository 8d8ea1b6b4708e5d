// How every subcommand reads its arguments.
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

namespace braid::cli {

// Options only: a stray word ("braid plan --config run.yaml extra") is an error. Without a
// positional description Boost would drop it silently.
inline boost::program_options::parsed_options parse_options(const std::vector<std::string>& args,
                                                            const boost::program_options::options_description& opts) {
  static const boost::program_options::positional_options_description kNone;
  return boost::program_options::command_line_parser(args).options(opts).positional(kNone).run();
}

}  // namespace braid::cli
