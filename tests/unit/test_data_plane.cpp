// choose_data_plane (lib/comm/data_plane.h): which transport carries the data plane for layout.transport, the device
// and the shape of the nodes; refusals name the reason and the fix.
#include <doctest/doctest.h>

#include <string>

#include "lib/comm/data_plane.h"
#include "lib/core/error.h"

using namespace dflash;
using comm::DataPlane;
using comm::TransportChoice;

namespace {

std::string refusal(comm::TransportChoice requested, bool cuda, bool built, comm::NodeShape node) {
  try {
    comm::choose_data_plane(requested, cuda, built, node);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("data plane: mpi is taken as asked, anywhere") {
  CHECK(comm::choose_data_plane(TransportChoice::mpi, false, false, {8, 0}) == DataPlane::Mpi);
  CHECK(comm::choose_data_plane(TransportChoice::mpi, true, true, {8, 8}) == DataPlane::Mpi);
}

TEST_CASE("data plane: auto is nccl only with cuda, NCCL built and a GPU per rank") {
  CHECK(comm::choose_data_plane(TransportChoice::automatic, true, true, {8, 8}) == DataPlane::Nccl);
  CHECK(comm::choose_data_plane(TransportChoice::automatic, true, true, {4, 8}) == DataPlane::Nccl);
  CHECK(comm::choose_data_plane(TransportChoice::automatic, true, true, {8, 1}) == DataPlane::Mpi);   // the tiny job on one GPU
  CHECK(comm::choose_data_plane(TransportChoice::automatic, false, true, {8, 8}) == DataPlane::Mpi);  // run.device cpu
  CHECK(comm::choose_data_plane(TransportChoice::automatic, true, false, {8, 8}) == DataPlane::Mpi);  // a build without NCCL
  CHECK(comm::choose_data_plane(TransportChoice::automatic, true, true, {1, 0}) == DataPlane::Mpi);   // no GPU visible
}

TEST_CASE("data plane: nccl is refused with the reason and the fix") {
  CHECK(comm::choose_data_plane(TransportChoice::nccl, true, true, {8, 8}) == DataPlane::Nccl);
  const std::string cpu = refusal(TransportChoice::nccl, false, true, {8, 8});
  CHECK(cpu.find("run.device is cpu") != std::string::npos);
  CHECK(cpu.find("layout.transport: mpi") != std::string::npos);
  CHECK(refusal(TransportChoice::nccl, true, false, {8, 8}).find("this build has no CUDA/NCCL") != std::string::npos);
  const std::string shared = refusal(TransportChoice::nccl, true, true, {8, 1});
  CHECK(shared.find("a node runs 8 ranks on 1 GPU(s)") != std::string::npos);
  CHECK(shared.find("NCCL refuses two ranks on one GPU") != std::string::npos);
  CHECK(refusal(TransportChoice::nccl, true, true, {2, 0}).find("a node shows no GPU") != std::string::npos);
}

TEST_CASE("data plane: the plane's name") {
  CHECK(std::string(comm::data_plane_name(DataPlane::Mpi)) == "mpi");
  CHECK(std::string(comm::data_plane_name(DataPlane::Nccl)) == "nccl");
}
