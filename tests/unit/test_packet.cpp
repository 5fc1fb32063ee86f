// Feature packets' arrays (lib/train/packet.h): where they live and how they are reused from packet to packet. The
// stream itself (order, back-pressure, stop, both data planes) is tested by tests/integration/stream_check.
#include <doctest/doctest.h>

#include <vector>

#include "lib/comm/transport.h"
#include "lib/train/packet.h"

using namespace dflash;

TEST_CASE("packet tensor: reshape keeps the allocation unless it must grow, assign and to_host round-trip") {
  train::PacketTensor t;
  CHECK(t.size() == 0);
  CHECK(t.data() == nullptr);
  t.reshape(MemoryKind::host, 100);
  REQUIRE(t.data() != nullptr);
  const float* first = t.data();
  t.reshape(MemoryKind::host, 40);  // a shorter sequence: the same memory
  CHECK(t.data() == first);
  CHECK(t.size() == 40);
  t.reshape(MemoryKind::host, 100);  // back within the allocation
  CHECK(t.data() == first);
  std::vector<float> values(100);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * float(i) - 7.f;
  t.assign(values.data(), values.size());
  CHECK(t.data() == first);
  CHECK(t.to_host() == values);
  t.reshape(MemoryKind::host, 1000);  // longer: a new allocation, of the new size
  CHECK(t.size() == 1000);
  CHECK(t.to_host().size() == 1000);
}

TEST_CASE("feature packet: allocate shapes tokens, mask, taps and final hidden from the header") {
  train::PacketHeader h;
  h.seq_len = 7;
  h.tap_width = 3 * 16;
  h.hidden = 16;
  train::FeaturePacket p;
  p.allocate(h);
  CHECK(p.tokens.size() == 7);
  CHECK(p.loss_mask.size() == 7);
  CHECK(p.taps.size() == 7 * 48);
  CHECK(p.final_hidden.size() == 7 * 16);
  CHECK(p.taps.memory() == MemoryKind::host);
  const float* taps = p.taps.data();
  h.seq_len = 5;  // the next, shorter sequence reuses the arrays
  p.allocate(h);
  CHECK(p.taps.size() == 5 * 48);
  CHECK(p.taps.data() == taps);
}

TEST_CASE("packet memory: device only for a GPU rank whose data plane takes device pointers") {
  struct DeviceTransport : comm::SelfTransport {
    bool takes_device_pointers() const override { return true; }
  };
  const comm::SelfTransport host_plane;
  const DeviceTransport device_plane;
  CHECK(train::packet_memory(false, host_plane) == MemoryKind::host);
  CHECK(train::packet_memory(true, host_plane) == MemoryKind::host);    // MPI on a GPU run: staged through the host
  CHECK(train::packet_memory(false, device_plane) == MemoryKind::host);  // CPU compute never holds device memory
  CHECK(train::packet_memory(true, device_plane) == MemoryKind::device);
}
