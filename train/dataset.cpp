#include "train/dataset.hpp"

#include <zlib.h>

#include <array>
#include <memory>
#include <stdexcept>

namespace gradlane::train {
namespace {

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw std::runtime_error(file.string() + ": " + what);
}

// Reads a whole file through zlib, which also reads uncompressed files as they are.
std::vector<std::uint8_t> read_all(const std::filesystem::path& file) {
  struct GzClose {
    void operator()(gzFile f) const { gzclose(f); }
  };
  std::unique_ptr<std::remove_pointer_t<gzFile>, GzClose> in(gzopen(file.c_str(), "rb"));
  if (!in) fail(file, "cannot open it");
  std::vector<std::uint8_t> bytes;
  std::array<std::uint8_t, 1 << 16> chunk{};
  for (;;) {
    const int got = gzread(in.get(), chunk.data(), chunk.size());
    if (got < 0) {
      int code = 0;
      fail(file, std::string("corrupt gzip data: ") + gzerror(in.get(), &code));
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  return bytes;
}

std::uint32_t big_endian(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) |
         std::uint32_t{b[at + 3]};
}

// IDX header: magic 0x00000800 | dims, then one big-endian u32 per dimension.
std::vector<std::size_t> idx_dims(const std::filesystem::path& file, const std::vector<std::uint8_t>& b,
                                  std::uint32_t want_dims) {
  if (b.size() < 4 + 4 * std::size_t{want_dims}) fail(file, "shorter than an IDX header");
  const std::uint32_t magic = big_endian(b, 0);
  if (magic != (0x0800U | want_dims)) {
    fail(file, "not an IDX file of unsigned bytes with " + std::to_string(want_dims) + " dimensions (magic " +
                   std::to_string(magic) + ")");
  }
  std::vector<std::size_t> dims;
  std::size_t total = 1;
  for (std::uint32_t d = 0; d < want_dims; ++d) {
    dims.push_back(big_endian(b, 4 + 4 * d));
    total *= dims.back();
  }
  if (b.size() != 4 + 4 * std::size_t{want_dims} + total) {
    fail(file, "holds " + std::to_string(b.size()) + " bytes, its header announces " +
                   std::to_string(4 + 4 * want_dims + total));
  }
  return dims;
}

}  // namespace

Dataset Dataset::slice(std::size_t first, std::size_t count) const {
  if (first > rows || count > rows - first) throw std::out_of_range("Dataset::slice past the end");
  Dataset out;
  out.rows = count;
  out.features = features;
  out.classes = classes;
  out.pixels.assign(pixels.begin() + static_cast<std::ptrdiff_t>(first * features),
                    pixels.begin() + static_cast<std::ptrdiff_t>((first + count) * features));
  out.labels.assign(labels.begin() + static_cast<std::ptrdiff_t>(first),
                    labels.begin() + static_cast<std::ptrdiff_t>(first + count));
  return out;
}

Dataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels) {
  const auto image_bytes = read_all(images);
  const auto label_bytes = read_all(labels);
  const auto image_dims = idx_dims(images, image_bytes, 3);
  const auto label_dims = idx_dims(labels, label_bytes, 1);
  if (image_dims[0] != label_dims[0]) {
    fail(labels, std::to_string(label_dims[0]) + " labels for " + std::to_string(image_dims[0]) + " images in " +
                     images.string());
  }
  Dataset set;
  set.rows = image_dims[0];
  set.features = image_dims[1] * image_dims[2];
  set.pixels.resize(set.rows * set.features);
  constexpr std::size_t kImageHeader = 16;
  for (std::size_t i = 0; i < set.pixels.size(); ++i) {
    set.pixels[i] = static_cast<float>(image_bytes[kImageHeader + i]) / 255.0F;
  }
  constexpr std::size_t kLabelHeader = 8;
  set.labels.assign(label_bytes.begin() + kLabelHeader, label_bytes.end());
  for (std::size_t i = 0; i < set.labels.size(); ++i) {
    if (set.labels[i] >= set.classes) {
      fail(labels, "label " + std::to_string(set.labels[i]) + " at row " + std::to_string(i) + " is not a class 0..9");
    }
  }
  return set;
}

Dataset load_fashion_mnist(const std::filesystem::path& dir, Split split) {
  const auto find = [&](const std::string& stem) {
    for (const auto& name : {stem, stem + ".gz"}) {
      if (std::filesystem::exists(dir / name)) return dir / name;
    }
    throw std::runtime_error(
        "Fashion-MNIST: " + (dir / (stem + ".gz")).string() +
        " not found. Install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist), "
        "or point --data at a directory with the four IDX files.");
  };
  const std::string prefix = split == Split::train ? "train" : "t10k";
  return load_idx(find(prefix + "-images-idx3-ubyte"), find(prefix + "-labels-idx1-ubyte"));
}

FashionMnist load_fashion_mnist(const std::filesystem::path& dir) {
  return {.train = load_fashion_mnist(dir, Split::train), .test = load_fashion_mnist(dir, Split::test)};
}

std::size_t rows_before_validation(const Dataset& training_set) {
  if (training_set.rows <= kValidationRows) {
    throw std::runtime_error("the training set has " + std::to_string(training_set.rows) +
                             " images, no more than the " + std::to_string(kValidationRows) +
                             " of the validation split: pass the full Fashion-MNIST training set");
  }
  return training_set.rows - kValidationRows;
}

}  // namespace gradlane::train
