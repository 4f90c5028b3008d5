//! UTF-8 checked as it arrives: text fails at its first invalid byte, even when the message
//! comes in fragments or a frame in pieces.

/// An incremental UTF-8 check (RFC 3629): the bytes still needed by the character being
/// read, and the range its next byte must be in (which excludes overlong forms, surrogates
/// and code points past U+10FFFF).
#[derive(Debug, Clone, Copy)]
pub(super) struct Utf8Check {
    need: u8,
    lo: u8,
    hi: u8,
}

impl Default for Utf8Check {
    fn default() -> Utf8Check {
        Utf8Check {
            need: 0,
            lo: 0x80,
            hi: 0xBF,
        }
    }
}

impl Utf8Check {
    /// Takes one byte; false when the text can no longer be UTF-8.
    pub fn byte(&mut self, b: u8) -> bool {
        if self.need > 0 {
            if b < self.lo || b > self.hi {
                return false;
            }
            *self = Utf8Check {
                need: self.need - 1,
                ..Utf8Check::default()
            };
            return true;
        }
        let (need, lo, hi) = match b {
            0x00..=0x7F => return true,
            0xC2..=0xDF => (1, 0x80, 0xBF),
            0xE0 => (2, 0xA0, 0xBF),
            0xE1..=0xEC | 0xEE..=0xEF => (2, 0x80, 0xBF),
            0xED => (2, 0x80, 0x9F),
            0xF0 => (3, 0x90, 0xBF),
            0xF1..=0xF3 => (3, 0x80, 0xBF),
            0xF4 => (3, 0x80, 0x8F),
            _ => return false,
        };
        *self = Utf8Check { need, lo, hi };
        true
    }

    /// Takes unmasked bytes; false when the text can no longer be UTF-8.
    pub fn bytes(&mut self, mut bytes: &[u8]) -> bool {
        while self.need > 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return true;
            };
            if !self.byte(b) {
                return false;
            }
            bytes = rest;
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => true,
            // Valid but for a character cut at the end: read it byte by byte.
            Err(e) if e.error_len().is_none() => {
                bytes[e.valid_up_to()..].iter().all(|&b| self.byte(b))
            }
            Err(_) => false,
        }
    }

    /// Whether the text read so far ends on a whole character.
    pub fn complete(&self) -> bool {
        self.need == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8Check;

    fn check(parts: &[&[u8]]) -> (bool, bool) {
        let mut c = Utf8Check::default();
        let ok = parts.iter().all(|p| c.bytes(p));
        (ok, c.complete())
    }

    #[test]
    fn characters_split_anywhere_are_whole_again() {
        let euro = "\u{20ac}".as_bytes();
        assert_eq!(check(&[&euro[..1], &euro[1..2], &euro[2..]]), (true, true));
        assert_eq!(check(&[b"ab", &euro[..2]]), (true, false));
        assert!(!check(&[&[0xc0, 0x80]]).0, "overlong");
        assert!(!check(&[&[0xed, 0xa0], &[0x80]]).0, "surrogate");
        assert!(!check(&[&[0xf4, 0x90]]).0, "past U+10FFFF");
        assert_eq!(check(&["h\u{e9}llo \u{1f600}".as_bytes()]), (true, true));
    }
}
