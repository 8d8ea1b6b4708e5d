// Reads YAML and writes JSON through the two libraries unpacked into the prefix.
#include <yaml-cpp/yaml.h>
#include <iostream>
#include <nlohmann/json.hpp>
int main() {
  YAML::Node n = YAML::Load("layers: 2");
  nlohmann::json j = {{"layers", n["layers"].as<int>()}};
  std::cout << j.dump() << "\n";
}
