//! Stop strings that may span tokens: text that could be the start of a
//! stop string is held back until the next piece decides.

/// A request's stop strings and the text held back.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    pending: String,
}

impl StopText {
    /// Watches for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds `piece`; returns the text that can be shown now, and whether a
    /// stop string was reached (the text before it is shown, nothing after).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            let shown = self.pending[..at].to_owned();
            self.pending.clear();
            return (shown, true);
        }
        // The longest end of the text that begins some stop string.
        let held = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let shown = self.pending[..held].to_owned();
        self.pending.drain(..held);
        (shown, false)
    }

    /// The text still held back, when the sequence ends otherwise.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::StopText;

    #[test]
    fn a_stop_string_spanning_pieces_is_found_and_held_text_comes_out() {
        let mut stop = StopText::new(vec!["\n\nUser:".to_owned(), "END".to_owned()]);
        assert_eq!(stop.push("Hello"), ("Hello".to_owned(), false));
        assert_eq!(stop.push(" world\n"), (" world".to_owned(), false));
        assert_eq!(stop.push("\nUs"), (String::new(), false));
        assert_eq!(stop.push("er: more"), (String::new(), true));

        let mut stop = StopText::new(vec!["END".to_owned()]);
        assert_eq!(stop.push("an E"), ("an ".to_owned(), false));
        assert_eq!(stop.push("nd"), ("End".to_owned(), false));
        assert_eq!(stop.push("xEN"), ("x".to_owned(), false));
        assert_eq!(stop.finish(), "EN");

        let mut none = StopText::new(vec![String::new()]);
        assert_eq!(none.push("é, ok"), ("é, ok".to_owned(), false));
    }
}
