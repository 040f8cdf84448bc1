//! Reading a call's real cost from its response ([`Cost`]): now, or at the
//! end of its body, watched as it streams ([`Watch`], over a body wrapped
//! by [`watched`]), so that the permit is settled when the body ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::limiter::outbound::{Draw, Heard, Outbound};

/// Watches a response body as it streams, for the call's real cost at its
/// end (e.g. a language model's usage, in the last event of a streamed
/// answer or in a JSON body): see [`Cost::watch`], and [`Cost::body`] and
/// [`Cost::lines`], which watch for you.
pub trait Watch: Send + 'static {
    /// Sees the next chunk of the body (chunks fall anywhere: mid-line,
    /// mid-word).
    fn chunk(&mut self, chunk: &[u8]);

    /// The body ended: the call's real cost, or `None` to keep the
    /// estimate.
    fn end(&mut self) -> Option<u64>;
}

/// How a call's real cost is read from its response: what
/// [`UpstreamMiddleware::settle_with`](super::UpstreamMiddleware::settle_with)'s
/// closure answers.
pub struct Cost(pub(super) Kind);

pub(super) enum Kind {
    Estimate,
    Now(u64),
    Watch(Box<dyn Watch>),
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Estimate => f.write_str("Cost::estimate()"),
            Kind::Now(cost) => write!(f, "Cost::now({cost})"),
            Kind::Watch(_) => f.write_str("Cost::watch(..)"),
        }
    }
}

/// The most of a body [`Cost::body`] keeps (16 MiB): a longer body keeps
/// the estimate.
const MOST_KEPT: usize = 16 << 20;

/// The longest line [`Cost::lines`] reads (1 MiB): a longer one is skipped.
const LONGEST_LINE: usize = 1 << 20;

impl Cost {
    /// The estimate stays: the real cost is not known.
    pub fn estimate() -> Self {
        Cost(Kind::Estimate)
    }

    /// The real cost is `cost` (e.g. read from a usage header).
    pub fn now(cost: u64) -> Self {
        Cost(Kind::Now(cost))
    }

    /// The real cost is read at the end of the body, by `watcher`, which
    /// sees each chunk as the caller reads it. The call is settled when the
    /// body ends (before the caller sees its end), or keeps its estimate
    /// if the body fails or is dropped before its end.
    pub fn watch(watcher: impl Watch) -> Self {
        Cost(Kind::Watch(Box::new(watcher)))
    }

    /// The real cost is read from the whole body, kept until it ends (at
    /// most 16 MiB; a longer one keeps the estimate): e.g. the usage of a
    /// JSON answer, as the caller reads it.
    ///
    /// ```
    /// use ratewall::reqwest::Cost;
    /// // `{"usage":{"total_tokens":42}}`, read with your JSON library of choice.
    /// let cost = Cost::body(|body: &[u8]| {
    ///     let text = std::str::from_utf8(body).ok()?;
    ///     let at = text.find("\"total_tokens\":")? + "\"total_tokens\":".len();
    ///     text[at..].trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    /// });
    /// # let _ = cost;
    /// ```
    pub fn body(read: impl FnOnce(&[u8]) -> Option<u64> + Send + 'static) -> Self {
        Cost::watch(Whole {
            kept: Vec::new(),
            overflowed: false,
            read: Some(read),
        })
    }

    /// The real cost is read from the body's lines, as they arrive: `read`
    /// sees each line (without its `\n` or `\r\n`; a last line without one
    /// too), and the last cost it gives is the call's (e.g. the usage
    /// event of a streamed answer, a server-sent event's `data: {..}`
    /// line). A line longer than 1 MiB is skipped.
    pub fn lines(read: impl FnMut(&[u8]) -> Option<u64> + Send + 'static) -> Self {
        Cost::watch(Lines {
            line: Vec::new(),
            overflowed: false,
            cost: None,
            read,
        })
    }
}

/// [`Cost::body`]'s watcher.
struct Whole<F> {
    kept: Vec<u8>,
    overflowed: bool,
    read: Option<F>,
}

impl<F: FnOnce(&[u8]) -> Option<u64> + Send + 'static> Watch for Whole<F> {
    fn chunk(&mut self, chunk: &[u8]) {
        if self.kept.len() + chunk.len() > MOST_KEPT {
            self.overflowed = true;
            self.kept = Vec::new();
        }
        if !self.overflowed {
            self.kept.extend_from_slice(chunk);
        }
    }

    fn end(&mut self) -> Option<u64> {
        if self.overflowed {
            tracing::debug!(
                "a response body past 16 MiB was not read for its cost: the estimate stays"
            );
            return None;
        }
        self.read.take().and_then(|read| read(&self.kept))
    }
}

/// [`Cost::lines`]' watcher.
struct Lines<F> {
    /// The current line, so far.
    line: Vec<u8>,
    /// Whether the current line grew past [`LONGEST_LINE`] (skipped).
    overflowed: bool,
    cost: Option<u64>,
    read: F,
}

impl<F: FnMut(&[u8]) -> Option<u64>> Lines<F> {
    fn line_ended(&mut self) {
        if !self.overflowed {
            let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
            if let Some(cost) = (self.read)(line) {
                self.cost = Some(cost);
            }
        }
        self.line.clear();
        self.overflowed = false;
    }
}

impl<F: FnMut(&[u8]) -> Option<u64> + Send + 'static> Watch for Lines<F> {
    fn chunk(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
                Some(at) => (&chunk[..at], Some(at + 1)),
                None => (chunk, None),
            };
            if self.line.len() + part.len() > LONGEST_LINE {
                self.overflowed = true;
                self.line.clear();
            }
            if !self.overflowed {
                self.line.extend_from_slice(part);
            }
            match ended {
                Some(next) => {
                    self.line_ended();
                    chunk = &chunk[next..];
                }
                None => break,
            }
        }
    }

    fn end(&mut self) -> Option<u64> {
        if !self.line.is_empty() || self.overflowed {
            self.line_ended();
        }
        self.cost
    }
}

/// An answered call whose cost its body tells: settled when the body ends.
pub(super) struct Watching {
    pub(super) outbound: Arc<Outbound>,
    pub(super) draw: Draw,
    pub(super) heard: Heard,
    pub(super) watch: Box<dyn Watch>,
}

/// The settlement under way.
type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a watched body is.
enum State {
    /// Streaming: each chunk goes to the watcher.
    Streaming(Box<Watching>),
    /// Ended: settling before the end is told.
    Settling(Settling),
    /// Settled, failed or given up: passes the rest through.
    Done,
}

impl Watching {
    /// The settlement, with the cost the watcher read (`None`: the
    /// estimate stays).
    fn settle(self: Box<Self>, cost: Option<u64>) -> Settling {
        Box::pin(async move {
            let Watching {
                outbound,
                draw,
                heard,
                ..
            } = *self;
            heard.settle(&outbound, &draw, cost).await;
        })
    }
}

/// A response body watched for the call's cost ([`Cost::watch`]).
pub(super) struct Watched {
    inner: reqwest::Body,
    /// Only ever reached through `&mut self` (`Mutex::get_mut`, never
    /// locked): it makes the body `Sync`, as reqwest asks, while the
    /// watcher and the settlement are only `Send`.
    state: Mutex<State>,
    /// Whether its end was told (after the settlement).
    ended: bool,
}

impl Watched {
    pub(super) fn new(inner: reqwest::Body, watching: Watching) -> Self {
        Self {
            inner,
            state: Mutex::new(State::Streaming(Box::new(watching))),
            ended: false,
        }
    }

    fn state(&mut self) -> &mut State {
        self.state.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let this = self.get_mut();
        loop {
            if let State::Settling(settling) = this.state() {
                ready!(settling.as_mut().poll(cx));
                *this.state() = State::Done;
                this.ended = true;
                return Poll::Ready(None);
            }
            let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let state = this.state();
            match frame {
                Some(Ok(frame)) => {
                    if let (State::Streaming(watching), Some(data)) =
                        (&mut *state, frame.data_ref())
                    {
                        watching.watch.chunk(data);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Some(Err(error)) => {
                    // Failed: the estimate stays (settled without a cost).
                    give_up(std::mem::replace(state, State::Done));
                    return Poll::Ready(Some(Err(error)));
                }
                None => match std::mem::replace(state, State::Done) {
                    State::Streaming(mut watching) => {
                        let cost = watching.watch.end();
                        *state = State::Settling(watching.settle(cost));
                    }
                    _ => {
                        this.ended = true;
                        return Poll::Ready(None);
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not before it is settled: the caller polls once more, and the
        // settlement runs then.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        give_up(std::mem::replace(self.state(), State::Done));
    }
}

/// A watched body that will not end: the call keeps its estimate, and
/// what the upstream said is still shared (a settlement under way is
/// finished), on the runtime the body was dropped on; without one, the
/// estimate stays and nothing more is shared.
fn give_up(state: State) {
    let settling = match state {
        State::Streaming(watching) => watching.settle(None),
        State::Settling(settling) => settling,
        State::Done => return,
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(settling);
        }
        Err(_) => tracing::debug!(
            "a response body watched for its cost was dropped outside a runtime: its estimate stays, the upstream's word is not shared"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(mut watcher: impl Watch, chunks: &[&[u8]]) -> Option<u64> {
        for chunk in chunks {
            watcher.chunk(chunk);
        }
        watcher.end()
    }

    fn lines_reader() -> impl FnMut(&[u8]) -> Option<u64> + Send + 'static {
        |line: &[u8]| {
            std::str::from_utf8(line)
                .ok()?
                .strip_prefix("data: usage=")?
                .parse()
                .ok()
        }
    }

    #[test]
    fn lines_are_read_across_chunks_and_the_last_cost_said_holds() {
        let Kind::Watch(watcher) = Cost::lines(lines_reader()).0 else {
            panic!("a watcher")
        };
        let chunks: [&[u8]; 5] = [
            b"data: {\"delta\":\"hi\"}\r\n\r\ndata: usa",
            b"ge=1",
            b"2\r\n\r\n",
            b"data: usage=40\n",
            b"data: usage=41",
        ];
        let mut watcher = watcher;
        for chunk in chunks {
            watcher.chunk(chunk);
        }
        // The last line, without its newline, is read at the end.
        assert_eq!(watcher.end(), Some(41));
        let Kind::Watch(mut one) = Cost::lines(lines_reader()).0 else {
            panic!("a watcher")
        };
        one.chunk(b"data: usage=12\r\n");
        one.chunk(b"data: [DONE]\n");
        assert_eq!(one.end(), Some(12));
    }

    #[test]
    fn a_line_past_the_longest_is_skipped_and_the_next_is_read() {
        let long = vec![b'x'; LONGEST_LINE + 1];
        let reader = Lines {
            line: Vec::new(),
            overflowed: false,
            cost: None,
            read: lines_reader(),
        };
        assert_eq!(
            fed(reader, &[b"data: usage=7\n", &long, b"\ndata: usage=9\n"]),
            Some(9)
        );
        let reader = Lines {
            line: Vec::new(),
            overflowed: false,
            cost: None,
            read: |_: &[u8]| Some(1),
        };
        assert_eq!(fed(reader, &[&long]), None, "an overlong last line");
    }

    #[test]
    fn a_whole_body_is_read_at_its_end_unless_too_long() {
        let whole = |kept| Whole {
            kept,
            overflowed: false,
            read: Some(|body: &[u8]| Some(body.len() as u64)),
        };
        assert_eq!(fed(whole(Vec::new()), &[b"{\"usage\":", b"3}"]), Some(11));
        let mut full = whole(vec![0; MOST_KEPT]);
        full.chunk(b"!");
        assert_eq!(full.end(), None);
        assert!(format!("{:?}", Cost::now(3)).contains('3'));
    }
}
