//! The memory store as a [`Backend`]: every operation answered at once.

use super::*;
use crate::model::key::Key;
use crate::store::backend::Block;

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.acquire_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .and_then(|()| self.acquire_once_sync(requests, request_id));
        Box::pin(std::future::ready(result))
    }

    fn cancel_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.cancel_once_sync(requests, request_id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.peek_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn peek_ahead<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        ahead: std::time::Duration,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .map(|()| {
                let ahead = crate::model::clock::micros(ahead);
                self.decide_targets(&targets(requests), false, ahead)
            });
        Box::pin(std::future::ready(result))
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.refund_sync(requests, at_micros);
        Box::pin(std::future::ready(Ok(())))
    }

    fn charge<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let result = Request::check_charge(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.charge_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn hold<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        after: std::time::Duration,
        left: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let result = Request::check_charge(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.hold_sync(requests, after, left));
        Box::pin(std::future::ready(result))
    }

    fn adjust<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        adjust: Adjust,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(std::future::ready(Ok(
            self.adjust_sync(prefix, name, adjust)
        )))
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.reset_sync(requests);
        Box::pin(std::future::ready(Ok(())))
    }

    fn blocks<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Vec<Block>, BackendError>> {
        Box::pin(std::future::ready(Ok(self.blocks_sync(key))))
    }

    fn unblock<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(std::future::ready(Ok(self.unblock_sync(key))))
    }

    fn acquire_lease<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        extra: &'a [u64],
        _ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<Leased, BackendError>> {
        let result =
            check_lease_batch(requests, extra).map(|()| self.acquire_lease_sync(requests, extra));
        Box::pin(std::future::ready(result))
    }

    fn return_lease<'a>(
        &'a self,
        returns: &'a [LeaseReturn<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.return_lease_sync(returns);
        Box::pin(std::future::ready(Ok(())))
    }

    fn cancels_once(&self) -> bool {
        true
    }

    fn reserves(&self) -> bool {
        true
    }

    fn reserve<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        max_wait: std::time::Duration,
    ) -> BoxFuture<'a, Result<Reservation, BackendError>> {
        let max_wait = micros(max_wait);
        let result = Request::check_reservation(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.reserve_sync(requests, max_wait));
        Box::pin(std::future::ready(result))
    }

    fn cancel<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        reservation: &'a Reservation,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.cancel_sync(requests, reservation);
        Box::pin(std::future::ready(Ok(())))
    }
}
