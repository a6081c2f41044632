// The shim's service thread: heartbeat, agent commands, GPU-timing completion.
//
// One detached thread per process, started at shim initialisation with every signal blocked
// (the job's signals must keep going to the job's threads). It ticks every 50 ms until the
// tracer is stopping. It is the only shim code that sleeps, and it never touches the caller's
// threads. Failure to start it leaves recording working, without heartbeat or mode changes.
#pragma once

namespace falcon::shim {

class Tracer;

// Returns false if the thread could not be created.
bool StartServiceThread(Tracer& tracer);

}  // namespace falcon::shim
