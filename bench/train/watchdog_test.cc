// Tests of the communicator watchdog (watchdog.h) against the NCCL emulator in this process:
// it polls, and an asynchronous error on a watched communicator ends the process with a message
// naming the communicator (a death test: the statement runs in a fresh child process).
#include "watchdog.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace falcon::train {
namespace {

TEST(WatchdogTest, PollsAHealthyCommunicatorAndStopsPromptly) {
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclSuccess);
  {
    Watchdog w(0, 0.01);
    w.Watch(comm, "world");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (w.polls() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(w.polls(), 3u);
  }  // joins before the communicator goes
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// A 2-rank communicator in one process on which only rank 0 issues an all-reduce: in the
// emulator's lenient mode the wait fails after 0.2 s and marks the communicator with an
// asynchronous error, which the watchdog must turn into an exit.
void RunUntilTheWatchdogExits() {
  setenv("FALCON_EMU_TIMEOUT_S", "0.2", 1);
  ncclComm_t comms[2] = {nullptr, nullptr};
  if (ncclCommInitAll(comms, 2, nullptr) != ncclSuccess) std::exit(3);
  Watchdog w(0, 0.05);
  w.Watch(comms[0], "tp.0");
  float x = 1;
  (void)ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comms[0], nullptr);  // fails: rank 1 never comes
  std::this_thread::sleep_for(std::chrono::seconds(10));
  std::exit(4);  // the watchdog did not end the process
}

TEST(WatchdogDeathTest, AnAsynchronousErrorEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunUntilTheWatchdogExits(), ::testing::ExitedWithCode(2),
              "rank 0: watchdog: communicator tp.0 reports an asynchronous error");
}

}  // namespace
}  // namespace falcon::train
