//! Ranks' output lines as text without losing a byte.
//!
//! The launcher handles output lines as `String`s (it adds `[rank K] `,
//! reassembles `mpirun`'s tagged pieces and reads its reports), but a rank
//! may print bytes that are not UTF-8. [`decode`] keeps them: each byte of
//! an invalid sequence, and each byte of a character in the range this
//! mapping uses (U+10FF00 to U+10FFFF, private use), becomes the character
//! U+10FF00 + byte; [`encode`] turns those back into the bytes. Every
//! other character is itself, so ASCII tags and prefixes parse as before,
//! and `encode(&decode(b)) == b` for every `b`.

/// The first character of the mapping.
const BASE: u32 = 0x10_FF00;

/// `bytes` as text, every byte kept (see the module's documentation).
pub(crate) fn decode(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if u32::from(c) >= BASE {
                let mut buf = [0u8; 4];
                c.encode_utf8(&mut buf)
                    .bytes()
                    .for_each(|b| text.push(mapped(b)));
            } else {
                text.push(c);
            }
        }
        chunk.invalid().iter().for_each(|&b| text.push(mapped(b)));
    }
    text
}

fn mapped(byte: u8) -> char {
    char::from_u32(BASE + u32::from(byte)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The bytes [`decode`] read.
pub(crate) fn encode(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len());
    for c in text.chars() {
        match u32::from(c).checked_sub(BASE) {
            Some(byte) => bytes.push(u8::try_from(byte).unwrap_or(b'?')),
            None => bytes.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_comes_back() {
        let samples: [&[u8]; 7] = [
            b"plain ascii",
            "caf\u{e9} \u{1F600}".as_bytes(),
            b"caf\xff\xfe end",
            b"\xe2\x82",
            b"cut \xf0\x9f\x98",
            "private \u{10FF41}\u{10FFFF}".as_bytes(),
            b"\x80\x80\xc3",
        ];
        for sample in samples {
            assert_eq!(encode(&decode(sample)), sample, "{sample:?}");
        }
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        assert_eq!(encode(&decode(&all)), all);
        // Valid text, tags included, is itself.
        assert_eq!(
            decode(b"[1,0]<stdout>:caf\xc3\xa9"),
            "[1,0]<stdout>:caf\u{e9}"
        );
    }
}
