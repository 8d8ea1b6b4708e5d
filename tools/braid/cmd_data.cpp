// braid data: look at the generated image-caption dataset (captions, tokens, text
// thumbnails) with a run file's seed and image-size distribution.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/common/error.hpp"
#include "core/data/shapes.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"

namespace po = boost::program_options;

namespace braid::cli {

int run_data(const std::vector<std::string>& args) {
  std::string config, split_text = "train", format = "table";
  long long first = 0;
  int show = 4, patch = 4, columns = 16;
  po::options_description opts(
      "usage: braid data [--config RUN.yaml] [--show N] [--first I] [--split train|heldout]\n"
      "                  [--patch P] [--columns C] [--format table|json]\n\n"
      "Prints samples of the generated image-caption dataset the reference models train on:\n"
      "caption, tokens and a text thumbnail of the image (one letter per colour). With a run\n"
      "file, the samples braid train draws for it: its data seed and image-size distribution on its\n"
      "image encoder's patch grid, up to the encoder's largest image.\n\noptions");
  opts.add_options()("help,h", "show this help")("config,c", po::value(&config)->value_name("RUN.yaml"),
                                                 "run file (default: seed 0, every image 64 px)")(
      "show,n", po::value(&show)->value_name("N"), "samples to print (default 4)")(
      "first", po::value(&first)->value_name("I"), "index of the first sample (default 0)")(
      "split", po::value(&split_text)->value_name("SPLIT"), "train (default) | heldout")(
      "patch", po::value(&patch)->value_name("P"),
      "image sides are multiples of P pixels (default 4; with --config: the run's)")(
      "columns", po::value(&columns)->value_name("C"), "thumbnail width in characters (default 16)")(
      "format,f", po::value(&format)->value_name("FMT"), "table (default) | json");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid data: error: %s\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return kExitOk;
  }
  auto bad = [](const char* what) {
    std::fprintf(stderr, "braid data: error: %s\n", what);
    return kExitBadInput;
  };
  if (format != "table" && format != "json") return bad("--format must be table or json");
  if (split_text != "train" && split_text != "heldout") return bad("--split must be train or heldout");
  if (show < 0 || first < 0) return bad("--show and --first must be >= 0");
  // Sample indices are int64: the last one shown must be one too.
  if (show > 0 && first > std::numeric_limits<long long>::max() - show) return bad("--first + --show is past 2^63 - 1");
  if (columns < 1 || columns > 256) return bad("--columns must be in [1, 256]");
  if (const std::string empty = empty_file_option(vm, {"config"}); !empty.empty()) return bad(empty.c_str());
  const auto split = split_text == "train" ? data::Split::train : data::Split::heldout;

  data::ShapesConfig shapes;
  if (vm.count("patch") && (patch < 1 || patch > shapes.max_side)) {
    const std::string why = "--patch must be in [1, " + std::to_string(shapes.max_side) +
                            "]: image sides are multiples of it, up to " + std::to_string(shapes.max_side) + " px";
    return bad(why.c_str());
  }
  shapes.patch = patch;
  if (!config.empty()) {  // what braid train draws for this run: its encoder's grid, not --patch
    if (vm.count("patch")) return bad("--patch is the run's image encoder's with --config");
    const spec::RunSpec run = spec::load_run(config);
    shapes = data::run_shapes_config(run, run.data.seed);
  }
  const data::ShapesDataset dataset(shapes);
  const char* sides = shapes.sides.kind == spec::SizeKind::fixed ? "fixed" : spec::size_kind_name(shapes.sides.kind);
  const int largest = dataset.largest_side(), smallest = dataset.smallest_side();

  if (format == "json") {
    nlohmann::ordered_json j;
    j["seed"] = shapes.seed;
    j["split"] = split_text;
    j["patch"] = shapes.patch;
    j["sides"] = sides;
    j["min_side"] = smallest;
    j["max_side"] = largest;
    j["vocab_size"] = data::CaptionTokenizer::vocab_size();
    j["scenes"] = data::kSceneCount;
    j["samples"] = nlohmann::ordered_json::array();
    for (long long i = first; i < first + show; ++i) {
      const auto s = dataset.get(i, split);
      j["samples"].push_back({{"index", i},
                              {"side", s.side},
                              {"scene_id", data::scene_id(s.scene)},
                              {"caption", s.caption},
                              {"tokens", s.tokens}});
    }
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  // A fixed distribution draws every image at the largest side, which is all there is to say.
  const std::string side_range = shapes.sides.kind == spec::SizeKind::fixed
                                     ? "every image " + std::to_string(largest) + " px (fixed)"
                                     : "image sides " + std::to_string(smallest) + "-" + std::to_string(largest) +
                                           " px on a " + std::to_string(shapes.patch) + " px grid (" + sides + ")";
  std::printf("shapes dataset: seed %llu, %s split, %s, vocabulary %d tokens\n",
              static_cast<unsigned long long>(shapes.seed), split_text.c_str(), side_range.c_str(),
              data::CaptionTokenizer::vocab_size());
  for (long long i = first; i < first + show; ++i) {
    const auto s = dataset.get(i, split);
    std::printf("\nsample %lld: %d x %d px, scene %lld\n  %s\n  tokens", i, s.side, s.side,
                static_cast<long long>(data::scene_id(s.scene)), s.caption.c_str());
    for (auto t : s.tokens) std::printf(" %d", t);
    std::printf("\n");
    const auto art = data::ascii_thumbnail(s, columns);
    std::size_t start = 0;
    for (std::size_t end; (end = art.find('\n', start)) != std::string::npos; start = end + 1)
      std::printf("  |%s|\n", art.substr(start, end - start).c_str());
  }
  return kExitOk;
}

}  // namespace braid::cli
