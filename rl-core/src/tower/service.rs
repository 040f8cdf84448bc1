//! [`RateLimitLayer`] as a tower layer: the [`RateLimit`] service and its
//! future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use ::tower::BoxError;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body as HttpBody;
use pin_project_lite::pin_project;

use super::body::ResponseBody;
use super::head::HttpHead;
use super::key::{self, Keys, PathParams};
use super::layer::{Extras, RateLimitLayer, Shared, Verdict};
use crate::limiter::Limiter;

/// The deciding half of a request on a remote store.
type Deciding = Pin<Box<dyn Future<Output = (Verdict, Parts)> + Send>>;

impl Shared {
    /// [`Shared::decide_now`] for a remote store: the request head is moved
    /// in and given back with the verdict.
    async fn decide(self: Arc<Self>, mut parts: Parts) -> (Verdict, Parts) {
        let limiter = match self.limiter() {
            Ok(limiter) => limiter,
            Err(rejection) => {
                let verdict = self.refused(&rejection, &HttpHead::of_parts(&parts, &None));
                return (verdict, parts);
            }
        };
        let params: PathParams = if self.params {
            key::path_params(&mut parts)
        } else {
            None
        };
        let head = HttpHead::of_parts(&parts, &params);
        let call = {
            let mut keys = Keys::new();
            match self.keys(head, &mut keys) {
                Ok(()) => Ok(self.call(limiter, head, &keys)),
                Err(problem) => Err(self.no_key(&problem, &head)),
            }
        };
        let verdict = match call {
            Ok(call) => self.verdict(call.await, &head),
            Err(verdict) => verdict,
        };
        (verdict, parts)
    }
}

impl<S> ::tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of a [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("call", &self.shared.spec.name())
            .finish_non_exhaustive()
    }
}

/// Decides `request` on the memory store when a key reads path parameters
/// or the whole head (the request is split for them), and calls `inner` if
/// admitted; gives the request back when it cannot be decided at once.
// The request goes back by value: boxing it would cost an allocation on the
// path that decides remotely.
#[allow(clippy::result_large_err)]
fn decide_parts<S, B, ResBody>(
    shared: &Shared,
    inner: &mut S,
    limiter: &Limiter,
    request: Request<B>,
) -> Result<ResponseFuture<S, B>, Request<B>>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    if shared.exempt.as_ref().is_some_and(|e| e.by_parts(&parts)) {
        let future = inner.call(Request::from_parts(parts, body));
        return Ok(ResponseFuture::admitted(future, None));
    }
    let params: PathParams = if shared.params {
        key::path_params(&mut parts)
    } else {
        None
    };
    match shared.decide_now(limiter, HttpHead::of_parts(&parts, &params)) {
        Some(Verdict::Admit(extras)) => {
            let future = inner.call(Request::from_parts(parts, body));
            Ok(ResponseFuture::admitted(future, extras))
        }
        Some(Verdict::Answer(response)) => Ok(ResponseFuture::answered(*response)),
        None => Err(Request::from_parts(parts, body)),
    }
}

impl<S> RateLimit<S> {
    /// Decides `request` on a remote store: the decision is a boxed future
    /// (started when first polled), then the service is called.
    fn decide_remote<B, ResBody>(&mut self, request: Request<B>) -> ResponseFuture<S, B>
    where
        S: ::tower::Service<Request<B>, Response = Response<ResBody>> + Clone,
        B: Send + 'static,
    {
        let (parts, body) = request.into_parts();
        if self
            .shared
            .exempt
            .as_ref()
            .is_some_and(|e| e.by_parts(&parts))
        {
            let future = self.inner.call(Request::from_parts(parts, body));
            return ResponseFuture::admitted(future, None);
        }
        // The service that was polled ready serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Deciding {
                decision: Box::pin(self.shared.clone().decide(parts)),
                inner: Some(inner),
                body: Some(body),
            },
        }
    }
}

impl<S, B, ResBody> ::tower::Service<Request<B>> for RateLimit<S>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Nothing exempted: one check. Predicates read the split request
        // (below, where it is split).
        if let Some(exempt) = &self.shared.exempt
            && exempt.by_line(request.method().as_str(), request.uri().path())
        {
            return ResponseFuture::admitted(self.inner.call(request), None);
        }
        let limiter = match self.shared.limiter() {
            Ok(limiter) => limiter,
            Err(rejection) => return self.no_limiter(request, &rejection),
        };
        if limiter.is_remote() {
            return self.decide_remote(request);
        }
        if self.shared.split {
            return match decide_parts(&self.shared, &mut self.inner, limiter, request) {
                Ok(future) => future,
                Err(request) => self.decide_remote(request),
            };
        }
        // In memory, from the borrowed request: decided before the service
        // is called, and the request is moved once, into the service.
        let verdict = self
            .shared
            .decide_now(limiter, HttpHead::of_request(&request));
        let extras = match verdict {
            Some(Verdict::Admit(extras)) => extras,
            Some(Verdict::Answer(response)) => return ResponseFuture::answered(*response),
            None => return self.decide_remote(request),
        };
        // Built in place (the service's future is large).
        ResponseFuture {
            state: State::Admitted {
                future: self.inner.call(request),
                extras,
            },
        }
    }
}

impl<S> RateLimit<S> {
    /// The answer to a request when no limiter is installed, unless a
    /// predicate exempts it.
    #[cold]
    #[inline(never)]
    fn no_limiter<B, ResBody>(
        &mut self,
        request: Request<B>,
        rejection: &crate::model::rejection::Rejection,
    ) -> ResponseFuture<S, B>
    where
        S: ::tower::Service<Request<B>, Response = Response<ResBody>>,
    {
        let (parts, body) = request.into_parts();
        if self
            .shared
            .exempt
            .as_ref()
            .is_some_and(|e| e.by_parts(&parts))
        {
            let future = self.inner.call(Request::from_parts(parts, body));
            return ResponseFuture::admitted(future, None);
        }
        let answer = self
            .shared
            .answer(rejection, &HttpHead::of_parts(&parts, &None));
        ResponseFuture::answered(answer)
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S, B>
    where
        S: ::tower::Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: ::tower::Service<Request<B>>,
    {
        // Answered without the service.
        Answered { response: Option<Response<Bytes>> },
        // Admitted: the service's response, the fields to add to it, and
        // the in-flight slots held until it is ready.
        Admitted { #[pin] future: S::Future, extras: Option<Box<Extras>> },
        // Being decided by a remote store.
        Deciding { decision: Deciding, inner: Option<S>, body: Option<B> },
    }
}

impl<S: ::tower::Service<Request<B>>, B> fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Answered { .. } => "Answered",
            State::Admitted { .. } => "Admitted",
            State::Deciding { .. } => "Deciding",
        };
        f.debug_tuple("ResponseFuture").field(&state).finish()
    }
}

impl<S: ::tower::Service<Request<B>>, B> ResponseFuture<S, B> {
    fn answered(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    fn admitted(future: S::Future, extras: Option<Box<Extras>>) -> Self {
        Self {
            state: State::Admitted { future, extras },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Answered { response } => {
                    // Polled again after completion: an empty 500 rather than a panic.
                    let response = response.take().unwrap_or_else(|| {
                        let mut gone = Response::new(Bytes::new());
                        *gone.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        gone
                    });
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
                StateProj::Admitted { future, extras } => {
                    let output = ready!(future.poll(cx));
                    // The response is ready: its slots go back now (on an
                    // error too).
                    let extras = extras.take();
                    return Poll::Ready(output.map(|response| {
                        let mut response = response.map(ResponseBody::inner);
                        if let Some(extras) = extras {
                            (*extras).finish_into(&mut response);
                        }
                        response
                    }));
                }
                StateProj::Deciding {
                    decision,
                    inner,
                    body,
                } => {
                    let (verdict, parts) = ready!(decision.as_mut().poll(cx));
                    let next = match (verdict, inner.take(), body.take()) {
                        (Verdict::Admit(extras), Some(mut inner), Some(body)) => State::Admitted {
                            future: inner.call(Request::from_parts(parts, body)),
                            extras,
                        },
                        (Verdict::Answer(response), _, _) => State::Answered {
                            response: Some(*response),
                        },
                        // Polled again after completion.
                        _ => State::Answered { response: None },
                    };
                    state.set(next);
                }
            }
        }
    }
}
