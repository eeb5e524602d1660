//! `memtrace agent`'s own steps, between the process tree and the sinks:
//! which processes to trace (`discovery`, polling `/proc`), who each one is
//! (`labels`), and each `--interval`'s [`crate::sinks::Window`] built from
//! the aggregator's report so far (`windows`). `crate::app` runs the loop.

pub mod discovery;
pub mod labels;
pub mod windows;
