//! Step 2 of the data flow: drains the `RECORDS` ring buffer. The kernel side
//! submits without waking the reader until a byte threshold is pending, so the
//! caller drains both when the ring buffer's fd becomes readable and on a
//! short timer.

use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::decode::{decode, DecodeError, Record};

/// Owns the ring buffer and counts what it read.
pub struct RecordReader {
    ring: AsyncFd<RingBuf<MapData>>,
    records: u64,
    decode_errors: u64,
    last_decode_error: Option<DecodeError>,
}

impl RecordReader {
    /// Wraps the ring buffer for use with tokio.
    ///
    /// # Errors
    /// When the fd cannot be registered with the tokio reactor.
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd, which stays open and the same
        // for as long as the RingBuf (moved into the AsyncFd) lives.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(io::Error::from)?;
        Ok(Self {
            ring,
            records: 0,
            decode_errors: 0,
            last_decode_error: None,
        })
    }

    /// Waits until the kernel wakes the reader (a byte threshold is pending).
    ///
    /// # Errors
    /// When the reactor fails.
    pub async fn wait_readable(&mut self) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Decodes every record available now and hands each to `sink`; records
    /// that fail to decode are counted (see [`Self::decode_errors`]).
    /// Returns how many records were read.
    pub fn drain(&mut self, mut sink: impl FnMut(Record)) -> usize {
        let mut read = 0;
        while let Some(item) = self.ring.get_mut().next() {
            read += 1;
            match decode(&item) {
                Ok(record) => sink(record),
                Err(err) => {
                    self.decode_errors += 1;
                    self.last_decode_error = Some(err);
                }
            }
        }
        self.records += read as u64;
        read
    }

    /// Records read so far, decodable or not.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Records that could not be decoded so far.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// The most recent decode error, for the report's warning.
    pub fn last_decode_error(&self) -> Option<&DecodeError> {
        self.last_decode_error.as_ref()
    }
}
