//! The `symbolize` stage for native code, before `aggregate`: a record's
//! native instruction pointer (`MemoryRecord::native_ip`) or its copied
//! user stack (`NativeStackRecord`, unwound by [`unwind`]) to function
//! names, cut at the interpreter boundary by [`chain`]. Python frames are
//! resolved by `crate::python`.

pub mod chain;
mod native;
pub mod unwind;

pub use native::{NativeName, NativeSymbolizer};
pub use unwind::{NativeUnwinder, StackCopy};
