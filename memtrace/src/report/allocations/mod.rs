//! Report step, allocator mode: draws an [`AllocationsReport`]
//! (`crate::allocations`) as the terminal section after the process table
//! ([`render_text`]), folded stacks ([`render_folded`]) and, through the
//! default mode's renderers, a flame graph, speedscope and pprof file, each
//! weighed by an [`AllocWeight`].
//!
//! [`AllocationsReport`]: crate::allocations::AllocationsReport

mod folded;
mod profiles;
#[cfg(test)]
mod tests;
mod text;

pub use folded::{render_folded, AllocWeight};
pub use profiles::{render_flamegraph, render_pprof, render_speedscope, ProfileRun};
pub use text::render_text;
