// "No crash, ever": every scalar of a complete run (model and cluster inline) is
// replaced, one at a time, by values of the wrong kind or size. Each variant must
// either load and plan, or stop with a braid::Error: never another exception.
#include <yaml-cpp/yaml.h>

#include <functional>

#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

YAML::Node inline_run(const std::string& run_file) {
  YAML::Node run = YAML::LoadFile(test::source_path("configs/runs/" + run_file));
  run["model"] = YAML::LoadFile(test::source_path("configs/runs/" + run["model"].as<std::string>()));
  run["cluster"] = YAML::LoadFile(test::source_path("configs/runs/" + run["cluster"].as<std::string>()));
  return run;
}

// Visits every scalar of the document, letting `fn` change it and put it back.
void each_scalar(YAML::Node node, const std::function<void(YAML::Node&)>& fn) {
  if (node.IsScalar()) {
    fn(node);
  } else if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) each_scalar(node[i], fn);
  } else if (node.IsMap()) {
    for (auto kv : node) each_scalar(kv.second, fn);
  }
}

void check_every_mutation(const std::string& run_file) {
  YAML::Node doc = inline_run(run_file);
  const std::vector<std::string> bad = {"-1",          "0",     "3",   "2.5",    "abc",   "",
                                        "99999999999", "1e308", "nan", "[1, 2]", "{a: 1}"};
  int variants = 0, loaded = 0, planned = 0;
  each_scalar(doc, [&](YAML::Node& scalar) {
    const std::string original = scalar.Scalar();
    for (const auto& value : bad) {
      scalar = YAML::Load(value.empty() ? "~" : value);
      YAML::Emitter out;
      out << doc;
      ++variants;
      try {
        spec::RunSpec run = spec::parse_run(out.c_str(), test::source_path("configs/runs"), "mutated.yaml");
        ++loaded;
        cost::CostModel cost(run);
        orchestrate::make_plan(cost, plan::PlanRequest{});
        ++planned;
      } catch (const Error&) {
        // A clean, reported failure.
      } catch (const std::exception& e) {
        ADD_FAILURE() << "value '" << value << "' in place of '" << original << "' escaped as " << e.what();
      }
      scalar = original;
    }
  });
  std::printf("  %s: %d variants, %d loaded, %d planned, the rest refused with a braid::Error\n", run_file.c_str(),
              variants, loaded, planned);
  EXPECT_GT(variants, 300);
}

TEST(Robustness, EveryScalarOfTheClipRun) { check_every_mutation("clip-vit-l14-64gpu.yaml"); }
TEST(Robustness, EveryScalarOfTheLlavaRun) { check_every_mutation("llava-13b-256gpu.yaml"); }

}  // namespace
}  // namespace braid
