//! A version 2 trace file written the way the preload writes it while a reader follows it:
//! space reserved before a block is handed out, a block's magic stored after the rest of its
//! header, and a batch of records stored with its first tag last, so a follower never sees a
//! half-written record. One writing thread. Used by tests/live.rs and benches/live.rs.
#![allow(dead_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vramtrace_format::{
    BLOCK_HEADER_LEN, BlockHeader, DEFAULT_BLOCK_SIZE, Deltas, Event, FRAME_HEADER_LEN, Header,
    MAX_EVENT_RECORD_LEN, MAX_PAYLOAD, Record, encode_event, frame_record,
};

/// A trace file being written.
pub struct LiveWriter {
    file: File,
    data_offset: u64,
    block_size: u64,
    tid: u32,
    next_block: u64,
    /// The current block's start, the next record's position in it, the deltas.
    current: Option<(u64, u64, Deltas)>,
}

impl LiveWriter {
    /// Creates `path` with `header`; records go into blocks of thread `tid`.
    pub fn create(path: &Path, header: &Header, tid: u32) -> std::io::Result<LiveWriter> {
        let file = File::create(path)?;
        let mut bytes = Vec::new();
        let data_offset = header.encode_blocks(DEFAULT_BLOCK_SIZE, &mut bytes);
        file.write_all_at(&bytes, 0)?;
        file.set_len(data_offset)?;
        Ok(LiveWriter {
            file,
            data_offset,
            block_size: DEFAULT_BLOCK_SIZE as u64,
            tid,
            next_block: 0,
            current: None,
        })
    }

    fn take_block(&mut self, t_ns: u64) -> std::io::Result<()> {
        let start = self.data_offset + self.next_block * self.block_size;
        self.file.set_len(start + self.block_size)?;
        let h = BlockHeader {
            tid: self.tid,
            seq: self.next_block,
            base_t_ns: t_ns,
            flags: 0,
        };
        let b = h.encode();
        self.file.write_all_at(&b[4..], start + 4)?;
        self.file.write_all_at(&b[..4], start)?;
        self.next_block += 1;
        self.current = Some((start, BLOCK_HEADER_LEN as u64, Deltas::at_block_start(&h)));
        Ok(())
    }

    /// Stores encoded records at the current position, the first tag last.
    fn store(&mut self, at: u64, buf: &[u8]) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(&buf[1..], at + 1)?;
        self.file.write_all_at(&buf[..1], at)
    }

    /// Appends events (in time order).
    pub fn events(&mut self, events: &[Event]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(events.len() * 24);
        let mut rec = [0u8; MAX_EVENT_RECORD_LEN];
        for e in events {
            if self.current.is_none() {
                self.take_block(e.t_ns)?;
            }
            let (start, pos, mut deltas) = self.current.expect("taken above");
            let n = encode_event(e, &mut deltas, &mut rec);
            if pos + (buf.len() + n) as u64 > self.block_size {
                self.store(start + pos, &buf)?;
                buf.clear();
                self.take_block(e.t_ns)?;
                let (s, p, mut d) = self.current.expect("taken above");
                let n = encode_event(e, &mut d, &mut rec);
                buf.extend_from_slice(&rec[..n]);
                self.current = Some((s, p, d));
                continue;
            }
            buf.extend_from_slice(&rec[..n]);
            self.current = Some((start, pos, deltas));
        }
        if let Some((start, pos, d)) = self.current {
            self.store(start + pos, &buf)?;
            self.current = Some((start, pos + buf.len() as u64, d));
        }
        Ok(())
    }

    /// Appends one record of another kind (a string, a device, an annotation, ...).
    pub fn record(&mut self, r: &Record, t_ns: u64) -> std::io::Result<()> {
        let mut v1 = vec![0u8; FRAME_HEADER_LEN + MAX_PAYLOAD];
        let frame = r.encode(&mut v1);
        let mut out = vec![0u8; frame.len() + 16];
        let n = frame_record(frame[1], &frame[FRAME_HEADER_LEN..], &mut out)
            .expect("room for the frame");
        if self
            .current
            .is_none_or(|(_, pos, _)| pos + n as u64 > self.block_size)
        {
            self.take_block(t_ns)?;
        }
        let (start, pos, d) = self.current.expect("taken above");
        self.store(start + pos, &out[..n])?;
        self.current = Some((start, pos + n as u64, d));
        Ok(())
    }
}
