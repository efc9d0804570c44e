#include "train/dataset.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>

namespace gradlane::train {
namespace {

namespace fs = std::filesystem;

class ScratchDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gradlane-train-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::vector<std::uint8_t>& bytes, bool gzip) {
    const fs::path path = dir_ / name;
    if (gzip) {
      gzFile out = gzopen(path.c_str(), "wb");
      EXPECT_NE(out, nullptr);
      EXPECT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
      gzclose(out);
    } else {
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    return path;
  }
  fs::path dir_;
};

void put_u32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<std::uint8_t>(v >> shift));
}

// Two 2×3 images and their labels.
std::vector<std::uint8_t> images_file(std::uint32_t magic = 0x803, std::uint32_t count = 2) {
  std::vector<std::uint8_t> b;
  put_u32(b, magic);
  put_u32(b, count);
  put_u32(b, 2);
  put_u32(b, 3);
  for (std::uint8_t v : {0, 51, 102, 153, 204, 255, 255, 0, 0, 0, 0, 255}) b.push_back(v);
  return b;
}
std::vector<std::uint8_t> labels_file(std::vector<std::uint8_t> labels = {7, 2}) {
  std::vector<std::uint8_t> b;
  put_u32(b, 0x801);
  put_u32(b, static_cast<std::uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

TEST_F(ScratchDir, ReadsPlainAndGzipIdxScaledToUnitRange) {
  for (const bool gzip : {false, true}) {
    const auto set = load_idx(write("i", images_file(), gzip), write("l", labels_file(), gzip));
    ASSERT_EQ(set.rows, 2U);
    ASSERT_EQ(set.features, 6U);
    EXPECT_FLOAT_EQ(set.pixels[1], 0.2F);
    EXPECT_FLOAT_EQ(set.pixels[5], 1.0F);
    EXPECT_FLOAT_EQ(set.image(1)[0], 1.0F);
    EXPECT_FLOAT_EQ(set.image(1)[1], 0.0F);
    EXPECT_EQ(set.labels, (std::vector<std::uint8_t>{7, 2}));
  }
}

TEST_F(ScratchDir, RefusesBrokenFilesNamingThem) {
  const auto labels = write("l", labels_file(), false);
  const auto expect_error = [&](const fs::path& images, const std::string& words) {
    try {
      (void)load_idx(images, labels);
      ADD_FAILURE() << "accepted " << images;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(images.filename().string()), std::string::npos) << e.what();
    }
  };
  expect_error(write("magic", images_file(0x801), false), "not an IDX file");
  auto truncated = images_file();
  truncated.pop_back();
  expect_error(write("short", truncated, false), "header announces");
  expect_error(write("count", images_file(0x803, 3), false), "header announces");
  expect_error(dir_ / "absent", "cannot open");
  try {
    (void)load_idx(write("i", images_file(), false), write("bad-label", labels_file({7, 10}), false));
    ADD_FAILURE() << "accepted label 10";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("label 10 at row 1"), std::string::npos) << e.what();
  }
}

TEST_F(ScratchDir, MissingDatasetSaysWhichPackageToInstall) {
  try {
    (void)load_fashion_mnist(dir_);
    ADD_FAILURE() << "loaded from an empty directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"), std::string::npos) << e.what();
  }
}

// A decompressed copy next to the gzipped files is the one read; each split alone, the other
// split's files need not exist.
TEST_F(ScratchDir, ASplitReadsThePlainFileBeforeTheGzippedOne) {
  write("t10k-images-idx3-ubyte.gz", images_file(), true);
  write("t10k-labels-idx1-ubyte.gz", labels_file({1, 1}), true);
  EXPECT_EQ(load_fashion_mnist(dir_, Split::test).labels, (std::vector<std::uint8_t>{1, 1}));
  write("t10k-labels-idx1-ubyte", labels_file({3, 4}), false);
  EXPECT_EQ(load_fashion_mnist(dir_, Split::test).labels, (std::vector<std::uint8_t>{3, 4}));
  EXPECT_THROW((void)load_fashion_mnist(dir_, Split::train), std::runtime_error);
}

// The workers train on the rows ahead of the validation split; a set that leaves them none is
// refused by name rather than wrapping around to 2^64 rows.
TEST(ValidationSplit, TheRowsAheadOfItAreTheTrainingRowsAndASetNoLargerIsRefused) {
  Dataset set;
  set.rows = kValidationRows + 1;
  EXPECT_EQ(rows_before_validation(set), 1U);
  set.rows = 60000;
  EXPECT_EQ(rows_before_validation(set), 50000U);
  set.rows = kValidationRows;
  try {
    (void)rows_before_validation(set);
    FAIL() << "a set of exactly the validation split's size was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no more than the 10000 of the validation split"), std::string::npos)
        << e.what();
  }
}

// Debian's dataset-fashion-mnist (ci/install-deps.sh installs it): the real files.
TEST(FashionMnist, DebianPackageLoads) {
  const auto data = load_fashion_mnist();
  EXPECT_EQ(data.train.rows, 60000U);
  EXPECT_EQ(data.test.rows, 10000U);
  EXPECT_EQ(data.train.features, 784U);
  // Balanced classes: 6,000 per class in train, 1,000 in test (the set's published make-up).
  std::vector<std::size_t> per_class(10, 0);
  for (auto label : data.test.labels) ++per_class[label];
  EXPECT_EQ(per_class, std::vector<std::size_t>(10, 1000));
  // First test image is an ankle boot (class 9) in the published set.
  EXPECT_EQ(data.test.labels[0], 9);
  const double mean = std::accumulate(data.test.pixels.begin(), data.test.pixels.end(), 0.0) /
                      static_cast<double>(data.test.pixels.size());
  EXPECT_GT(mean, 0.2);  // ~0.286: pixels scaled, not raw bytes and not all zero
  EXPECT_LT(mean, 0.4);
  const auto head = data.test.slice(10, 5);
  EXPECT_EQ(head.rows, 5U);
  EXPECT_EQ(head.labels[0], data.test.labels[10]);
  EXPECT_EQ(head.image(4)[300], data.test.image(14)[300]);
}

}  // namespace
}  // namespace gradlane::train
