//! The attached programs, one file per area; each program is named after its
//! hook and delegates to a `try_<hook>` function.

pub mod alloc;
pub mod faults;
pub mod rss;
pub mod sampler;
pub mod sched;
pub mod syscalls;
