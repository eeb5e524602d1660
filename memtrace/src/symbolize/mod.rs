//! The `symbolize` stage for native code: the innermost native instruction
//! of a record (`MemoryRecord::native_ip`) to a function name, before
//! `aggregate`. Python frames are resolved by `crate::python`.

mod native;

pub use native::{NativeName, NativeSymbolizer};
