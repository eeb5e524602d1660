//! Step 3 of the data flow: the traced process tree. [`tree`] keeps which
//! processes are traced, their roles and whether their Python layout is known;
//! `model` names processes and images for every later step;
//! [`launch`] starts `memtrace run`'s command held before its execve;
//! [`proc`] reads what /proc says about them; [`maps`] names the mapping an
//! address belongs to; [`sharing`] paces the reads of their PSS and USS.

pub mod launch;
pub mod maps;
mod model;
pub mod proc;
pub mod sharing;
pub mod tree;

pub use model::{ProcessId, PythonStatus, Role, Sharing};
pub use tree::{ProcessTree, PythonState, TracedProcess};
