//! [`ResponseBody`]: the body of the route layer's responses.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::tower::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a [`RateLimit`](super::RateLimit) service's responses:
    /// the wrapped service's own body when the request was let through (not
    /// boxed, not copied), else the layer's answer (a refusal, a request
    /// without a key) in one piece. An [`http_body::Body`] with `Bytes`
    /// data, as axum routers, tonic servers and hyper take.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The wrapped service's body.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// The layer's own answer.
    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner(..)"),
            Kind::Full { data } => f
                .debug_tuple("ResponseBody::Full")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(Into::into))),
            KindProj::Full { data } => Poll::Ready(data.take().map(|data| Ok(Frame::data(data)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn frames<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Vec<Bytes>
    where
        B::Error: fmt::Debug,
    {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            if let Ok(data) = frame.unwrap().into_data() {
                out.push(data);
            }
        }
        out
    }

    #[test]
    fn the_layers_answer_is_one_frame_of_its_exact_size() {
        let body = ResponseBody::<String>::full(Bytes::from_static(b"{}"));
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        assert_eq!(frames(body), [Bytes::from_static(b"{}")]);
        let empty = ResponseBody::<String>::full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(frames(empty).is_empty());
    }

    #[test]
    fn the_services_body_passes_through() {
        let body = ResponseBody::inner(String::from("hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(frames(body), [Bytes::from_static(b"hello")]);
    }
}
