// Replays a fuzz corpus without libFuzzer: every file under the given paths (default: this target's corpus folder)
// goes through LLVMFuzzerTestOneInput once. A crash or sanitizer report fails the CTest run.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> roots;
  for (int i = 1; i < argc; ++i) roots.emplace_back(argv[i]);
  if (roots.empty()) roots.emplace_back(LCPLAN_FUZZ_CORPUS);
  std::vector<fs::path> files;
  for (const auto& r : roots) {
    if (fs::is_directory(r)) {
      for (const auto& e : fs::recursive_directory_iterator(r))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(r)) {
      files.push_back(r);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", r.c_str());
      return 1;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no corpus files found (an empty corpus would make this test pass vacuously)\n");
    return 1;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs, no crash\n", files.size());
  return 0;
}
