// How every subcommand reads its arguments.
#pragma once

#include <boost/program_options.hpp>

#include <initializer_list>
#include <string>
#include <vector>

#include "core/common/text.hpp"

namespace braid::cli {

// Options only: a stray word ("braid plan --config run.yaml extra") is an error, which names
// the word (without a positional description Boost would drop it silently); an unknown option
// gets the nearest known one.
inline boost::program_options::parsed_options parse_options(const std::vector<std::string>& args,
                                                            const boost::program_options::options_description& opts) {
  namespace po = boost::program_options;
  static const po::positional_options_description kNone;
  try {
    return po::command_line_parser(args).options(opts).positional(kNone).run();
  } catch (const po::unknown_option& e) {
    std::vector<std::string> known;
    for (const auto& option : opts.options()) known.push_back("--" + option->long_name());
    std::string given = e.get_option_name();
    given = given.substr(0, given.find('='));  // --frist=3
    const std::string guess = braid::closest_match(given, known);
    if (guess.empty()) throw;
    throw po::error(std::string(e.what()) + " (did you mean '" + guess + "'?)");
  } catch (const po::too_many_positional_options_error&) {
    // Parsed again with the stray words collected, to say which.
    po::options_description with_words;
    with_words.add(opts);
    with_words.add_options()("braid-stray-words", po::value<std::vector<std::string>>());
    po::positional_options_description words;
    words.add("braid-stray-words", -1);
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(with_words).positional(words).run(), vm);
    if (!vm.count("braid-stray-words")) throw;
    throw po::error("unexpected word '" + vm["braid-stray-words"].as<std::vector<std::string>>().front() +
                    "': options begin with -- (see --help)");
  }
}

// The first of `options` (long names of string options) given with an empty value, as
// "--metrics names no file"; "" when none is. Given but empty is a mistake (an unset shell
// variable), not the option left out.
inline std::string empty_file_option(const boost::program_options::variables_map& vm,
                                     std::initializer_list<const char*> options) {
  for (const char* option : options)
    if (vm.count(option) && vm[option].as<std::string>().empty()) return std::string("--") + option + " names no file";
  return "";
}

}  // namespace braid::cli
