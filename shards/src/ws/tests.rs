//! The WebSocket codec's tests.

use super::*;

/// A client frame, masked as a client must.
fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    super::encode_masked_frame(&mut out, (if fin { 0x80 } else { 0 }) | opcode, payload);
    out
}

fn events(d: &mut Decoder, bytes: &[u8]) -> Result<(usize, Vec<String>), WsError> {
    let mut buf = bytes.to_vec();
    let mut seen = Vec::new();
    let used = d.decode(&mut buf, |e| {
        seen.push(format!("{e:?}"));
        true
    })?;
    Ok((used, seen))
}

#[test]
fn text_binary_and_ping() {
    let mut d = Decoder::new(1024);
    let mut bytes = frame(true, 1, b"hello");
    bytes.extend(frame(true, 2, &[0, 1, 2]));
    bytes.extend(frame(true, 9, b"p"));
    let (used, seen) = events(&mut d, &bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(
        seen,
        ["Text(\"hello\")", "Binary([0, 1, 2])", "Ping([112])"]
    );
}

#[test]
fn partial_frame_waits() {
    let mut d = Decoder::new(1024);
    let bytes = frame(true, 1, b"hello");
    let (used, seen) = events(&mut d, &bytes[..bytes.len() - 1]).unwrap();
    assert_eq!((used, seen.len()), (0, 0));
}

#[test]
fn fragments_reassemble_with_control_frames_between() {
    let mut d = Decoder::new(1024);
    let mut bytes = frame(false, 1, b"hel");
    bytes.extend(frame(true, 9, b""));
    bytes.extend(frame(false, 0, b"l"));
    bytes.extend(frame(true, 0, b"o"));
    let (_, seen) = events(&mut d, &bytes).unwrap();
    assert_eq!(seen, ["Ping([])", "Text(\"hello\")"]);
    assert!(!d.in_message());
}

#[test]
fn size_limit_at_max_and_past_it() {
    let mut d = Decoder::new(10);
    assert!(events(&mut d, &frame(true, 2, &[7; 10])).is_ok());
    assert_eq!(
        events(&mut d, &frame(true, 2, &[7; 11])),
        Err(WsError::TooBig)
    );
    let mut d = Decoder::new(10);
    let mut bytes = frame(false, 2, &[7; 6]);
    bytes.extend(frame(true, 0, &[7; 5]));
    assert_eq!(events(&mut d, &bytes), Err(WsError::TooBig));
    // The header alone is enough to refuse: no need to buffer the payload.
    let mut d = Decoder::new(10);
    let big = frame(true, 2, &[0; 100]);
    assert_eq!(events(&mut d, &big[..8]), Err(WsError::TooBig));
}

#[test]
fn protocol_errors() {
    let mut d = Decoder::new(1024);
    let mut unmasked = vec![0x81, 0x02];
    unmasked.extend_from_slice(b"hi");
    assert!(matches!(
        events(&mut d, &unmasked),
        Err(WsError::Protocol(_))
    ));
    assert!(matches!(
        events(&mut Decoder::new(9), &frame(true, 3, b"")),
        Err(WsError::Protocol(_))
    ));
    assert!(matches!(
        events(&mut Decoder::new(9), &frame(true, 0, b"x")),
        Err(WsError::Protocol(_))
    ));
    assert!(matches!(
        events(&mut Decoder::new(9), &frame(false, 9, b"")),
        Err(WsError::Protocol(_))
    ));
    assert!(matches!(
        events(&mut Decoder::new(999), &frame(true, 9, &[0; 126])),
        Err(WsError::Protocol(_))
    ));
    let mut rsv = frame(true, 1, b"x");
    rsv[0] |= 0x40;
    assert!(matches!(
        events(&mut Decoder::new(9), &rsv),
        Err(WsError::Protocol(_))
    ));
    assert_eq!(
        events(&mut Decoder::new(9), &frame(true, 1, &[0xff, 0xfe])),
        Err(WsError::InvalidUtf8)
    );
    assert!(matches!(
        events(&mut Decoder::new(9), &frame(true, 8, &[3])),
        Err(WsError::Protocol(_))
    ));
    assert!(matches!(
        events(
            &mut Decoder::new(9),
            &frame(true, 8, &1005u16.to_be_bytes())
        ),
        Err(WsError::Protocol(_))
    ));
}

#[test]
fn close_stops_decoding() {
    let mut d = Decoder::new(99);
    let mut bytes = frame(true, 8, &[0x03, 0xe8, b'b', b'y', b'e']);
    bytes.extend(frame(true, 1, b"after"));
    let (used, seen) = events(&mut d, &bytes).unwrap();
    assert_eq!(seen, ["Close(Some(1000), \"bye\")"]);
    assert!(used < bytes.len());
}

#[test]
fn encode_is_readable_by_tungstenite() {
    let mut out = Vec::new();
    encode_text(&mut out, "hi");
    encode_close(&mut out, Some(close::TOO_BIG), &"x".repeat(200));
    let mut c = Cursor::new(&out);
    let (h, len) = FrameHeader::parse(&mut c).unwrap().unwrap();
    assert_eq!((h.opcode, len), (OpCode::Data(Data::Text), 2));
    c.set_position(c.position() + len);
    let (h, len) = FrameHeader::parse(&mut c).unwrap().unwrap();
    assert_eq!((h.opcode, len), (OpCode::Control(Control::Close), 125));
}

#[test]
fn invalid_text_fails_as_soon_as_its_bytes_arrive() {
    // One text frame whose invalid byte (0xff) arrives before the rest of the frame.
    let payload = [b"hello".as_slice(), &[0xff], &[b'x'; 100]].concat();
    let bytes = frame(true, 1, &payload);
    let mut d = Decoder::new(1024);
    // The head and "hello" arrived: fine so far, nothing decoded.
    assert_eq!(events(&mut d, &bytes[..6 + 5]), Ok((0, vec![])));
    // Then the invalid byte: refused before the frame is complete.
    assert_eq!(events(&mut d, &bytes[..6 + 6]), Err(WsError::InvalidUtf8));

    // In a fragmented message: refused at the fragment holding it, before the final one.
    let mut d = Decoder::new(1024);
    let first = frame(false, 1, "h\u{e9}".as_bytes());
    assert!(events(&mut d, &first).is_ok());
    assert_eq!(
        events(&mut d, &frame(false, 0, &[0xc0, 0x80])),
        Err(WsError::InvalidUtf8)
    );

    // A character split over two fragments, or over two reads, is fine.
    let mut d = Decoder::new(1024);
    let euro = "\u{20ac}".as_bytes();
    let mut bytes = frame(false, 1, &euro[..1]);
    bytes.extend(frame(true, 0, &euro[1..]));
    assert_eq!(events(&mut d, &bytes).unwrap().1, ["Text(\"\u{20ac}\")"]);
    let mut d = Decoder::new(1024);
    let bytes = frame(true, 1, "a\u{20ac}".as_bytes());
    assert_eq!(events(&mut d, &bytes[..6 + 2]), Ok((0, vec![])));
    assert_eq!(events(&mut d, &bytes).unwrap().1, ["Text(\"a\u{20ac}\")"]);

    // A message that ends inside a character is refused.
    let mut d = Decoder::new(1024);
    assert_eq!(
        events(&mut d, &frame(true, 1, &euro[..2])),
        Err(WsError::InvalidUtf8)
    );
    // Surrogates and code points past U+10FFFF are refused.
    for bad in [
        &[0xed, 0xa0, 0x80][..],
        &[0xf4, 0x90, 0x80, 0x80],
        &[0xe0, 0x80, 0x80],
    ] {
        let mut d = Decoder::new(1024);
        assert_eq!(
            events(&mut d, &frame(true, 1, bad)),
            Err(WsError::InvalidUtf8)
        );
    }
}

#[test]
fn a_length_with_its_top_bit_set_is_a_protocol_error() {
    let mut bytes = vec![0x82, 0x80 | 127];
    bytes.extend_from_slice(&(1u64 << 63).to_be_bytes());
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    let mut d = Decoder::new(1024);
    assert!(matches!(events(&mut d, &bytes), Err(WsError::Protocol(_))));
}

/// A frame with RSV1 set (a compressed message's first frame).
fn compressed(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = frame(fin, opcode, payload);
    f[0] |= 0x40;
    f
}

#[test]
fn compressed_messages_decompress_whole_or_in_fragments() {
    let text = "{\"t\":\"say\",\"text\":\"hello hello hello hello\"}";
    let z = deflate::deflate(text.as_bytes()).unwrap();
    let mut d = Decoder::new(1024).with_deflate(true);
    d.allow_inflate(1 << 20);
    let mut bytes = compressed(true, 1, &z);
    // Fragmented: RSV1 on the first frame only, a ping between the fragments.
    let (a, b) = z.split_at(z.len() / 2);
    bytes.extend(compressed(false, 2, a));
    bytes.extend(frame(true, 9, b""));
    bytes.extend(frame(true, 0, b));
    // A plain message after them: compression is per message.
    bytes.extend(frame(true, 1, b"plain"));
    let (used, seen) = events(&mut d, &bytes).unwrap();
    assert_eq!(used, bytes.len());
    let bin = format!("Binary({:?})", text.as_bytes());
    assert_eq!(
        seen,
        [
            format!("Text({text:?})"),
            "Ping([])".into(),
            bin,
            "Text(\"plain\")".into()
        ]
    );
    assert_eq!(d.take_inflated(), 2);
    assert_eq!(d.take_inflated(), 0);
    assert_eq!(d.inflate_left(), (1 << 20) - 2 * text.len() as u64);
}

#[test]
fn compression_rules_are_enforced() {
    let z = deflate::deflate(b"hello").unwrap();
    let err = |d: Decoder, bytes: &[u8]| events(&mut { d }, bytes).unwrap_err();
    // Not negotiated: RSV1 is a protocol error.
    assert_eq!(
        err(Decoder::new(1024), &compressed(true, 1, &z)),
        WsError::Protocol("reserved bits set")
    );
    let on = || {
        let mut d = Decoder::new(1024).with_deflate(true);
        d.allow_inflate(1 << 20);
        d
    };
    // RSV1 on a continuation or a control frame.
    let mut bytes = compressed(false, 1, &z);
    bytes.extend(compressed(true, 0, b""));
    assert_eq!(err(on(), &bytes), WsError::Protocol("reserved bits set"));
    assert_eq!(
        err(on(), &compressed(true, 9, b"")),
        WsError::Protocol("reserved bits set")
    );
    // Invalid UTF-8 once decompressed, data that does not decompress, and a bomb: 1007, 1007,
    // 1009, whatever the compressed size.
    let bad_text = deflate::deflate(&[b'a', 0xff, b'b']).unwrap();
    assert_eq!(
        err(on(), &compressed(true, 1, &bad_text)),
        WsError::InvalidUtf8
    );
    assert_eq!(
        err(on(), &compressed(true, 2, &[0xff; 8])),
        WsError::BadDeflate
    );
    let bomb = deflate::deflate(&[b'x'; 100_000]).unwrap();
    assert!(bomb.len() < 1024);
    assert_eq!(err(on(), &compressed(true, 1, &bomb)), WsError::TooBig);
    assert_eq!(WsError::BadDeflate.code(), close::INVALID_DATA);
}

#[test]
fn decompressing_is_bounded_by_the_ratio_and_the_byte_rate() {
    let max = 1 << 20;
    let on = |allowed: u64| {
        let mut d = Decoder::new(max).with_deflate(true);
        d.allow_inflate(allowed);
        d
    };
    let err = |mut d: Decoder, bytes: &[u8]| events(&mut d, bytes).unwrap_err();
    // 512 KiB of one byte: a few hundred bytes compressed, far past the ratio.
    let bomb = deflate::deflate(&vec![b'x'; 512 * 1024]).unwrap();
    assert!((bomb.len() as u64) * WS_INFLATE_RATIO_MAX < 512 * 1024);
    assert_eq!(err(on(max), &compressed(true, 1, &bomb)), WsError::Ratio);
    assert_eq!(WsError::Ratio.code(), close::TOO_BIG);
    // Under the floor any ratio passes: a short run of one character.
    let run = deflate::deflate(&[b'!'; 4000]).unwrap();
    assert!((run.len() as u64) * WS_INFLATE_RATIO_MAX < 4000);
    let mut d = on(max);
    assert_eq!(
        events(&mut d, &compressed(true, 1, &run)).unwrap().1.len(),
        1
    );
    // Noise compresses to about its size: within the ratio, and within the bytes allowed
    // until they are spent.
    let noise: Vec<u8> = (0..30_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let z = deflate::deflate(&noise).unwrap();
    let mut d = on(50_000);
    assert_eq!(events(&mut d, &compressed(true, 2, &z)).unwrap().1.len(), 1);
    assert_eq!(d.inflate_left(), 20_000);
    assert_eq!(err(d, &compressed(true, 2, &z)), WsError::InflateRate);
    assert_eq!(WsError::InflateRate.code(), close::POLICY);
    // Nothing allowed: no compressed message at all; plain ones are not counted.
    let mut d = on(0);
    assert_eq!(
        events(&mut d, &frame(true, 1, b"plain")).unwrap().1.len(),
        1
    );
    assert_eq!(err(d, &compressed(true, 1, &run)), WsError::InflateRate);
}

#[test]
fn masked_frames_are_what_a_node_reads_from_a_client() {
    let mut bytes = Vec::new();
    super::encode_masked(&mut bytes, 1, b"hello");
    super::encode_masked(&mut bytes, 2, &[7u8; 300]);
    super::encode_masked(&mut bytes, 10, b"p");
    // Two frames of the same payload are masked differently.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    super::encode_masked(&mut a, 1, b"same");
    super::encode_masked(&mut b, 1, b"same");
    assert_ne!(a, b);
    let (used, seen) = events(&mut Decoder::new(1024), &bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0], "Text(\"hello\")");
    assert!(seen[1].starts_with("Binary([7, 7"), "{}", seen[1]);
    assert_eq!(seen[2], "Pong");
}
