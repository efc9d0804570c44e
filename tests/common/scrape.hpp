// Scraping a Prometheus endpoint in tests: one HTTP GET over a plain socket (no client library
// in the test's way) and a sample's value read from the text format.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace gradlane::test {

// GET http://address:port/metrics; the body, or throws naming what failed. Bounded by `timeout`.
inline std::string scrape(const std::string& address, std::uint16_t port,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("scrape: socket() failed");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1)
    throw std::runtime_error("scrape: bad address " + address);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    throw std::runtime_error("scrape: nothing answers on " + address + ":" + std::to_string(port));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    throw std::runtime_error("scrape: send failed");
  }
  std::string response;
  // Until the body's Content-Length has come (an exposer may keep the connection open), or the
  // server closes the connection.
  const auto complete = [&response] {
    const auto head_end = response.find("\r\n\r\n");
    if (head_end == std::string::npos) return false;
    const auto length_at = response.find("Content-Length: ");
    if (length_at == std::string::npos || length_at > head_end) return false;
    return response.size() - (head_end + 4) >= std::stoul(response.substr(length_at + 16));
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (char buffer[4096]; !complete();) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      throw std::runtime_error("scrape: no complete answer from " + address + ":" + std::to_string(port));
    }
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0) throw std::runtime_error("scrape: recv failed");
    if (n == 0) break;
    response.append(buffer, static_cast<std::size_t>(n));
  }
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos) {
    throw std::runtime_error("scrape: not a 200 answer: " + response.substr(0, response.find('\n')));
  }
  const auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

// The value of the sample written exactly `sample` (name and labels as the exporter writes
// them, e.g. gradlaned_decisions_total{kind="grant"}); nullopt if there is none.
inline std::optional<double> sample_value(const std::string& text, const std::string& sample) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > sample.size() && line.compare(0, sample.size(), sample) == 0 && line[sample.size()] == ' ') {
      return std::stod(line.substr(sample.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace gradlane::test
