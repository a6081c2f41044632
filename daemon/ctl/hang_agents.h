// `falcon-ctl hang --agents`: the job-wide picture, live. Sends a `progress` command to every
// agent of the job (Redis), waits for their acks and merges each rank's progress (ack results
// `progress`, a rank of the falcon-progress document) into one HangInput: ranks held by a Falcon
// pause are listed as paused, and quiet_s is the job's youngest latest call.
// Single-threaded; talks to Redis only. Must never: use an ack that failed validation, or a
// rank's progress that fails the document's parser (each is reported on stderr and left out).
#pragma once

#include <string>

#include "daemon/ctl/hang_input.h"
#include "daemon/ctl/redis_cli.h"
#include "falcon/status.h"

namespace falcon::ctl {

struct AgentsProgressOptions {
  RedisCliOptions redis;  // job, server, timeout_s: how long to wait for the agents' acks
  int calls = 16;         // latest calls per communicator each agent includes
};

// Errors: Unavailable (Redis), NotFound (no agent registered, or no agent answered).
// Agents that do not answer in time are named on stderr; their ranks are then missing.
[[nodiscard]] Result<HangInput> LoadAgentsProgress(AgentsProgressOptions options);

}  // namespace falcon::ctl
