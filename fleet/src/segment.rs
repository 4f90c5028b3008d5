//! Segments: one committed batch's WAL frames, packed to ship to the bucket, and the restore
//! that turns a snapshot and its segments back into a database.
//!
//! ## What a segment holds
//!
//! SQLite's WAL (`<db>-wal`) is a 32-byte header (magic, version, page size, checkpoint
//! sequence, two salts, a checksum) followed by frames: a 24-byte frame header (page number,
//! the database size in pages after a commit or 0 for a frame that does not end a transaction,
//! the two salts, a running checksum) and one page. A transaction is the frames up to and
//! including its commit frame. A segment carries the frames of whole transactions, as they are
//! in the WAL, behind a header of its own:
//!
//! ```text
//! magic "combdsg1" | version u32 | page_size u32 | seq u64 | token i64 | prev_token i64 |
//! frames u32 | name_len u16 | name | frames (24 + page_size bytes each) | crc32 u32
//! ```
//!
//! (little-endian; the CRC-32 covers every byte before it; in the bucket the segment is
//! sealed as well, `Bucket::put_sealed`, with the fleet key's MAC of its key and bytes). `seq` is the object's segment
//! number: the snapshot a restore starts from covers segments up to some `seq`, and each
//! segment after it is the next number. `token` is the fencing token of the owner that wrote
//! it and `prev_token` the token of the segment before it, so a restore follows the chain back
//! from the head recorded in the coordinator and never picks up a segment that a stale owner
//! uploaded under a number the real owner also used (the bucket has no conditional put).
//!
//! ## Restore
//!
//! [`restore`] writes the snapshot (a checkpointed database file), then each segment's pages at
//! their page numbers, truncating the file to the database size that each commit frame
//! records. The result is the database as of the last segment's last commit, with no WAL to
//! recover: SQLite opens it as it opens any database.

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use combd_kernel::limits::{FLEET_SEGMENT_MAX_BYTES, FLEET_SNAPSHOT_MAX_BYTES};

/// Bytes of the WAL file's header.
pub const WAL_HEADER_BYTES: u64 = 32;
/// Bytes of a WAL frame's header (the page follows it).
pub const WAL_FRAME_HEADER_BYTES: u64 = 24;
/// The segment format's magic: its first eight bytes.
pub const SEGMENT_MAGIC: [u8; 8] = *b"combdsg1";
/// The segment format's version.
pub const SEGMENT_VERSION: u32 = 1;
/// The WAL's magic numbers (big-endian checksums, little-endian checksums).
const WAL_MAGIC: [u32; 2] = [0x377f_0682, 0x377f_0683];
/// Bytes of a segment's header before its object name.
const FIXED_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 8 + 4 + 2;

/// Why WAL frames could not be packed, or a segment read or restored.
#[derive(Debug)]
pub enum SegmentError {
    /// Reading or writing a file failed.
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        error: std::io::Error,
    },
    /// The WAL or the segment is not what it should be (the message says how).
    Malformed(String),
    /// The frames of one transaction do not fit a segment.
    TooLarge {
        /// Bytes the segment would take.
        bytes: u64,
        /// [`FLEET_SEGMENT_MAX_BYTES`].
        limit: usize,
    },
    /// The segments handed to a restore do not follow each other or the snapshot.
    Gap {
        /// The segment number expected.
        expected: u64,
        /// The one found.
        found: u64,
    },
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::Io { op, error } => write!(f, "{op}: {error}"),
            SegmentError::Malformed(m) => write!(f, "malformed: {m}"),
            SegmentError::TooLarge { bytes, limit } => write!(
                f,
                "a transaction's frames take {bytes} bytes as a segment; at most {limit}"
            ),
            SegmentError::Gap { expected, found } => {
                write!(f, "segment {found} where segment {expected} should follow")
            }
        }
    }
}

impl std::error::Error for SegmentError {}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> SegmentError {
    move |error| SegmentError::Io { op, error }
}

fn malformed(m: impl Into<String>) -> SegmentError {
    SegmentError::Malformed(m.into())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A WAL's header, as far as shipping needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WalHeader {
    page_size: u32,
    /// The two salts (bytes 16..24): every frame of this generation of the WAL repeats them.
    salts: [u8; 8],
}

impl WalHeader {
    fn parse(b: &[u8]) -> Result<WalHeader, SegmentError> {
        if b.len() < WAL_HEADER_BYTES as usize {
            return Err(malformed("the WAL header is cut short"));
        }
        if !WAL_MAGIC.contains(&be32(b, 0)) {
            return Err(malformed("the WAL header's magic is not SQLite's"));
        }
        let page_size = be32(b, 8);
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(malformed(format!(
                "the WAL's page size {page_size} is not one"
            )));
        }
        let mut salts = [0; 8];
        salts.copy_from_slice(&b[16..24]);
        Ok(WalHeader { page_size, salts })
    }
}

/// Where shipping stands in an object's WAL: the end of the last frames packed, and the WAL
/// generation (its salts) they belong to.
///
/// Call [`WalCursor::next_segment`] right after each commit, before the next transaction can
/// begin: once SQLite has checkpointed the whole WAL, the next writer starts it over from the
/// top with new salts, overwriting frames. The cursor sees the new salts and starts over too;
/// frames it had not read by then are lost to it (so the object should checkpoint only after
/// a segment is shipped, with `wal_autocheckpoint` off).
#[derive(Debug, Clone, Default)]
pub struct WalCursor {
    header: Option<WalHeader>,
    offset: u64,
    /// Where to go on from in a WAL of these salts, before the cursor read any header.
    resume: Option<([u8; 8], u64)>,
    /// The last read found nothing of its generation after what it packed.
    at_end: bool,
}

/// Frames a cursor reads at first: what a batch commits is mostly a few frames, and a WAL that
/// SQLite started over (a `RESTART` checkpoint) keeps the older generation's frames after the
/// new one's, which are not read past (the read doubles while it finds only frames of its own).
const FIRST_READ_FRAMES: u64 = 4;

impl WalCursor {
    /// A cursor at the start of a WAL it has not read yet.
    pub fn new() -> WalCursor {
        WalCursor::default()
    }

    /// A cursor that goes on at `offset` in the WAL generation of `salts` (where an earlier
    /// cursor stood, [`WalCursor::position`]); in a WAL of another generation it starts at its
    /// first frame, as a new cursor does.
    pub fn resume(salts: [u8; 8], offset: u64) -> WalCursor {
        WalCursor {
            resume: Some((salts, offset.max(WAL_HEADER_BYTES))),
            ..WalCursor::default()
        }
    }

    /// Where it stands: the salts of the WAL generation it reads and the offset after the last
    /// frame it packed; `None` before it read a WAL's header.
    pub fn position(&self) -> Option<([u8; 8], u64)> {
        self.header.map(|h| (h.salts, self.offset))
    }

    /// The offset in the WAL file after the last frame packed (0 before any).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the last read found nothing of the WAL's generation after what it packed (the
    /// file's end, or a frame of an older generation): a next read now would find nothing.
    pub fn at_end(&self) -> bool {
        self.at_end
    }

    /// Packs the frames committed since the last call (whole transactions only) as segment
    /// `seq` of `object`; `None` if no transaction committed since. `token` is the owner's
    /// fencing token and `prev_token` that of segment `seq - 1`.
    ///
    /// Transactions that together do not fit one segment ([`FLEET_SEGMENT_MAX_BYTES`]) are
    /// split between segments at a commit, so call it until it answers `None`; a single
    /// transaction that does not fit fails with [`SegmentError::TooLarge`].
    pub fn next_segment(
        &mut self,
        wal_path: &Path,
        object: &str,
        seq: u64,
        token: i64,
        prev_token: i64,
    ) -> Result<Option<Segment>, SegmentError> {
        self.next_segment_upto(wal_path, object, seq, token, prev_token, u64::MAX)
    }

    /// [`WalCursor::next_segment`], reading no further than `limit` bytes into the WAL: the
    /// WAL's length right after the last commit to ship, taken by its writer, so that a
    /// transaction being written meanwhile (its commit frame's header written before its page)
    /// is never read half-written.
    pub fn next_segment_upto(
        &mut self,
        wal_path: &Path,
        object: &str,
        seq: u64,
        token: i64,
        prev_token: i64,
        limit: u64,
    ) -> Result<Option<Segment>, SegmentError> {
        let mut file = match File::open(wal_path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open the WAL")(e)),
        };
        let mut head = [0u8; WAL_HEADER_BYTES as usize];
        let len = file
            .metadata()
            .map_err(io("stat the WAL"))?
            .len()
            .min(limit);
        if len < WAL_HEADER_BYTES {
            return Ok(None);
        }
        file.read_exact(&mut head)
            .map_err(io("read the WAL header"))?;
        let header = WalHeader::parse(&head)?;
        if self.header != Some(header) {
            // A new WAL generation (or the first look): its frames start after the header,
            // unless the cursor goes on where an earlier one stood in this generation.
            self.header = Some(header);
            self.offset = match self.resume.take() {
                Some((salts, offset)) if salts == header.salts => offset,
                _ => WAL_HEADER_BYTES,
            };
        }
        let frame_bytes = WAL_FRAME_HEADER_BYTES + u64::from(header.page_size);
        let available = (len.saturating_sub(self.offset) / frame_bytes) * frame_bytes;
        self.at_end = available == 0;
        if available == 0 {
            return Ok(None);
        }
        let fixed = (FIXED_HEADER_BYTES + object.len() + 4) as u64;
        // The most frame bytes one segment holds; read one frame more, to tell a transaction
        // that does not fit from one that ends right at the limit.
        let max_frames =
            (FLEET_SEGMENT_MAX_BYTES as u64).saturating_sub(fixed) / frame_bytes * frame_bytes;
        let want = available.min(max_frames + frame_bytes);
        file.seek(SeekFrom::Start(self.offset))
            .map_err(io("seek in the WAL"))?;
        let mut frames = read_generation(&mut file, want, frame_bytes, &header.salts)?;
        // Keep the frames of this generation up to the last commit frame that fits.
        let (end, at) = commits_end(&frames, frame_bytes as usize, &header.salts, max_frames);
        let stale_next = frames
            .get(at + 8..at + 16)
            .is_some_and(|s| s != header.salts);
        self.at_end = end == at && (stale_next || at as u64 == available);
        if end == 0 {
            if at as u64 > max_frames {
                return Err(SegmentError::TooLarge {
                    bytes: fixed + available,
                    limit: FLEET_SEGMENT_MAX_BYTES,
                });
            }
            return Ok(None); // a transaction still being written, or nothing new
        }
        frames.truncate(end);
        self.offset += end as u64;
        Segment::new(object, seq, token, prev_token, header.page_size, frames).map(Some)
    }
}

/// Reads up to `want` bytes of frames from where `file` stands, [`FIRST_READ_FRAMES`] first,
/// then twice as many more at a time while every frame read is of the generation of `salts`:
/// what follows the first frame of another generation is never read.
fn read_generation(
    file: &mut File,
    want: u64,
    frame_bytes: u64,
    salts: &[u8; 8],
) -> Result<Vec<u8>, SegmentError> {
    let mut frames: Vec<u8> = Vec::new();
    let mut more = FIRST_READ_FRAMES * frame_bytes;
    loop {
        let from = frames.len();
        let upto = (from as u64 + more).min(want) as usize;
        frames.resize(upto, 0);
        file.read_exact(&mut frames[from..])
            .map_err(io("read WAL frames"))?;
        let stale = frames[from..]
            .chunks(frame_bytes as usize)
            .any(|f| f.len() >= 16 && f[8..16] != *salts);
        if stale || upto as u64 >= want {
            return Ok(frames);
        }
        more *= 2;
    }
}

/// Where the frames of one WAL generation (its `salts`) end at their last commit frame, reading
/// no more than `max` bytes of them, and how far the reading went: `(end, read)`, `end` 0 if
/// no commit frame ended within them.
fn commits_end(frames: &[u8], frame_bytes: usize, salts: &[u8], max: u64) -> (usize, usize) {
    let mut end = 0usize;
    let mut at = 0usize;
    while at + frame_bytes <= frames.len() {
        let h = &frames[at..at + WAL_FRAME_HEADER_BYTES as usize];
        if h[8..16] != *salts {
            break; // a frame of an older generation: the end of this one
        }
        at += frame_bytes;
        if at as u64 > max {
            break; // past what one segment holds
        }
        if be32(h, 4) != 0 {
            end = at;
        }
    }
    (end, at)
}

/// One segment: whole transactions' WAL frames of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The object's name.
    pub object: String,
    /// The segment number.
    pub seq: u64,
    /// The fencing token of the owner that wrote it.
    pub token: i64,
    /// The fencing token of the owner that wrote segment `seq - 1` (or the snapshot it
    /// follows).
    pub prev_token: i64,
    /// The database's page size.
    pub page_size: u32,
    /// The frames, each a 24-byte WAL frame header and a page.
    frames: Vec<u8>,
}

impl Segment {
    fn new(
        object: &str,
        seq: u64,
        token: i64,
        prev_token: i64,
        page_size: u32,
        frames: Vec<u8>,
    ) -> Result<Segment, SegmentError> {
        if object.len() > usize::from(u16::MAX) {
            return Err(malformed("the object name is too long"));
        }
        let frame_bytes = WAL_FRAME_HEADER_BYTES as usize + page_size as usize;
        if frames.is_empty() || !frames.len().is_multiple_of(frame_bytes) {
            return Err(malformed("a segment holds whole frames, at least one"));
        }
        let last = frames.len() - frame_bytes;
        if be32(&frames, last + 4) == 0 {
            return Err(malformed("a segment must end with a commit frame"));
        }
        Ok(Segment {
            object: object.to_string(),
            seq,
            token,
            prev_token,
            page_size,
            frames,
        })
    }

    /// How many frames it holds.
    pub fn frame_count(&self) -> usize {
        self.frames.len() / (WAL_FRAME_HEADER_BYTES as usize + self.page_size as usize)
    }

    /// Each frame as (page number, database size in pages after it or 0, page).
    pub fn frames(&self) -> impl Iterator<Item = (u32, u32, &[u8])> {
        self.frames
            .chunks(WAL_FRAME_HEADER_BYTES as usize + self.page_size as usize)
            .map(|f| {
                (
                    be32(f, 0),
                    be32(f, 4),
                    &f[WAL_FRAME_HEADER_BYTES as usize..],
                )
            })
    }

    /// The segment as bytes, to upload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(FIXED_HEADER_BYTES + self.object.len() + self.frames.len() + 4);
        out.extend_from_slice(&SEGMENT_MAGIC);
        out.extend_from_slice(&SEGMENT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.page_size.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.prev_token.to_le_bytes());
        out.extend_from_slice(&(self.frame_count() as u32).to_le_bytes());
        out.extend_from_slice(&(self.object.len() as u16).to_le_bytes());
        out.extend_from_slice(self.object.as_bytes());
        out.extend_from_slice(&self.frames);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a segment from its bytes, checking its magic, version, checksum and shape.
    pub fn decode(bytes: &[u8]) -> Result<Segment, SegmentError> {
        if bytes.len() > FLEET_SEGMENT_MAX_BYTES {
            return Err(SegmentError::TooLarge {
                bytes: bytes.len() as u64,
                limit: FLEET_SEGMENT_MAX_BYTES,
            });
        }
        if bytes.len() < FIXED_HEADER_BYTES + 4 {
            return Err(malformed("a segment is cut short"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(body) != crc {
            return Err(malformed("the segment's checksum does not match its bytes"));
        }
        if body[..8] != SEGMENT_MAGIC {
            return Err(malformed("not a segment (its magic is wrong)"));
        }
        let mut at = 8;
        let mut take = |n: usize| {
            let s = &body[at..at + n];
            at += n;
            s
        };
        let u32le = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let u64le = |s: &[u8]| {
            let mut b = [0; 8];
            b.copy_from_slice(s);
            u64::from_le_bytes(b)
        };
        let version = u32le(take(4));
        if version != SEGMENT_VERSION {
            return Err(malformed(format!(
                "segment version {version}, not {SEGMENT_VERSION}"
            )));
        }
        let page_size = u32le(take(4));
        let seq = u64le(take(8));
        let token = u64le(take(8)) as i64;
        let prev_token = u64le(take(8)) as i64;
        let frame_count = u32le(take(4)) as usize;
        let n = take(2);
        let name_len = usize::from(u16::from_le_bytes([n[0], n[1]]));
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(malformed(format!("page size {page_size}")));
        }
        let frame_bytes = WAL_FRAME_HEADER_BYTES as usize + page_size as usize;
        if body.len() != FIXED_HEADER_BYTES + name_len + frame_count * frame_bytes {
            return Err(malformed("the segment's length does not match its header"));
        }
        let object = std::str::from_utf8(&body[FIXED_HEADER_BYTES..FIXED_HEADER_BYTES + name_len])
            .map_err(|_| malformed("the object name is not UTF-8"))?;
        let frames = body[FIXED_HEADER_BYTES + name_len..].to_vec();
        Segment::new(object, seq, token, prev_token, page_size, frames)
    }
}

/// The page size a database file's header records (bytes 16..18, 1 meaning 65536).
fn db_page_size(header: &[u8]) -> Option<u32> {
    if header.len() < 100 || &header[..16] != b"SQLite format 3\0" {
        return None;
    }
    match u16::from_be_bytes([header[16], header[17]]) {
        1 => Some(65536),
        n => Some(u32::from(n)),
    }
}

/// Writes the database at `out` from a snapshot (a checkpointed database file, or `None` for an
/// object whose first segment starts from nothing) and the segments that follow it, in order:
/// the first must be number `snapshot_seq + 1`, each the next, and each written by the owner
/// its successor names (`prev_token`). Returns the number of the last segment applied.
///
/// `out` is created or truncated; the caller opens it with SQLite afterwards (and should check
/// it with `PRAGMA integrity_check`).
pub fn restore(
    out: &Path,
    snapshot: Option<&[u8]>,
    snapshot_seq: u64,
    segments: &[Segment],
) -> Result<u64, SegmentError> {
    let mut file = File::create(out).map_err(io("create the restored database"))?;
    if let Some(s) = snapshot {
        file.write_all(s).map_err(io("write the snapshot"))?;
    }
    drop(file);
    restore_onto(out, snapshot.is_some(), snapshot_seq, segments)
}

/// Writes the pages of `seg` into the database `file` (and its size, at each commit frame).
fn write_pages(file: &mut File, seg: &Segment) -> Result<(), SegmentError> {
    let page = u64::from(seg.page_size);
    // No page past the largest database a fleet node keeps: a forged number would make a
    // sparse file at a huge offset.
    let pages_max = FLEET_SNAPSHOT_MAX_BYTES / page;
    for (pgno, db_pages, data) in seg.frames() {
        if pgno == 0 {
            return Err(malformed(format!("segment {} writes page 0", seg.seq)));
        }
        if u64::from(pgno) > pages_max || u64::from(db_pages) > pages_max {
            return Err(malformed(format!(
                "segment {} writes page {pgno} of a database of {db_pages} pages: past the \
                 {pages_max} pages of {page} bytes a fleet database may have",
                seg.seq
            )));
        }
        file.seek(SeekFrom::Start((u64::from(pgno) - 1) * page))
            .map_err(io("seek in the restored database"))?;
        file.write_all(data).map_err(io("write a page"))?;
        if db_pages != 0 {
            file.set_len(u64::from(db_pages) * page)
                .map_err(io("size the restored database"))?;
        }
    }
    Ok(())
}

/// [`restore`] onto the snapshot already written at `out` (streamed there from the bucket) if
/// `on_snapshot`, else onto a new empty file.
pub fn restore_onto(
    out: &Path,
    on_snapshot: bool,
    snapshot_seq: u64,
    segments: &[Segment],
) -> Result<u64, SegmentError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(!on_snapshot)
        .open(out)
        .map_err(io("open the restored database"))?;
    let mut expected_page_size = None;
    if on_snapshot && file.metadata().map_err(io("read the snapshot"))?.len() > 0 {
        let mut header = [0u8; 100];
        file.read_exact(&mut header)
            .map_err(|_| malformed("the snapshot is not a SQLite database"))?;
        expected_page_size = Some(
            db_page_size(&header)
                .ok_or_else(|| malformed("the snapshot is not a SQLite database"))?,
        );
    }
    let mut seq = snapshot_seq;
    for pair in segments.windows(2) {
        if pair[1].prev_token != pair[0].token {
            return Err(malformed(format!(
                "segment {} names owner token {} before it, but segment {} was written by {}",
                pair[1].seq, pair[1].prev_token, pair[0].seq, pair[0].token
            )));
        }
    }
    for seg in segments {
        if seg.seq != seq + 1 {
            return Err(SegmentError::Gap {
                expected: seq + 1,
                found: seg.seq,
            });
        }
        if *expected_page_size.get_or_insert(seg.page_size) != seg.page_size {
            return Err(malformed(format!(
                "segment {} has pages of {} bytes, the database {:?}",
                seg.seq, seg.page_size, expected_page_size
            )));
        }
        write_pages(&mut file, seg)?;
        seq = seg.seq;
    }
    file.sync_all().map_err(io("sync the restored database"))?;
    Ok(seq)
}
