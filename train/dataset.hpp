// Fashion-MNIST (or any MNIST-format set) as float images in [0, 1] and labels 0..9.
// The files are the IDX files Debian's dataset-fashion-mnist installs (gzip-compressed, or
// plain): train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-… for the test set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace gradlane::train {

// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// gradlane_train's validation split: the last 10,000 training images (learning rates are chosen
// on it); its workers never train on them.
inline constexpr std::size_t kValidationRows = 10000;

struct Dataset {
  std::size_t rows = 0;              // images
  std::size_t features = 0;          // pixels per image (784)
  std::vector<float> pixels;         // rows × features, row-major, each in [0, 1]
  std::vector<std::uint8_t> labels;  // rows, each < classes
  std::size_t classes = 10;

  std::span<const float> image(std::size_t row) const { return {pixels.data() + row * features, features}; }
  // Rows [first, first + count) as a new set (a validation split, a small test set).
  Dataset slice(std::size_t first, std::size_t count) const;
};

struct FashionMnist {
  Dataset train;  // 60,000 images unless limited
  Dataset test;   // 10,000
};

// Reads one IDX images file and its labels file (".gz" or not). Throws std::runtime_error
// naming the file and what is wrong with it (missing, truncated, wrong magic, mismatched counts).
Dataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels);

enum class Split { train, test };

// Reads one split of Fashion-MNIST from `dir`, each file plain if it is there, else gzipped: a
// decompressed copy (tests/faults/run-faults.sh makes one) spares every process the inflate,
// seconds each in the emulator. A missing file gets an error that says to install Debian's
// dataset-fashion-mnist or pass another directory.
Dataset load_fashion_mnist(const std::filesystem::path& dir, Split split);

// Both splits.
FashionMnist load_fashion_mnist(const std::filesystem::path& dir = kDefaultFashionMnistDir);

// The training rows ahead of the validation split: the rows workers train on, and where the
// split starts. Throws std::runtime_error if the set is no larger than the split.
std::size_t rows_before_validation(const Dataset& training_set);

}  // namespace gradlane::train
