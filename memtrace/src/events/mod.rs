//! Step 2 of the data flow: records leave the kernel through one BPF ring
//! buffer; [`reader`] drains it, [`decode`](mod@decode) turns each record's bytes into a
//! typed [`decode::Record`].

pub mod decode;
pub mod reader;

pub use decode::{decode, DecodeError, Record};
pub use reader::RecordReader;
