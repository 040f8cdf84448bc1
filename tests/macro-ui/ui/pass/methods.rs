//! Methods taking `&self`, `&mut self` and `self`, with keys and limiters
//! read from `self`, and an associated function without a receiver.

use std::sync::Arc;

use ratewall::{Limiter, Rejection, rate_limit};

struct Service {
    tenant: String,
    limiter: Arc<Limiter>,
    calls: u32,
}

impl Service {
    #[rate_limit(period = 60, threshold = 10, key = self.tenant, limiter = self.limiter)]
    async fn get(&self, id: u32) -> Result<u32, Rejection> {
        Ok(id + self.calls)
    }

    #[rate_limit(period = 60, threshold = 10, key = self.tenant, limiter = self.limiter)]
    async fn bump(&mut self) -> Result<u32, Rejection> {
        self.calls += 1;
        Ok(self.calls)
    }

    #[rate_limit(period = 60, threshold = 10, key = self.tenant.len(), limiter = self.limiter.clone())]
    async fn finish(self) -> Result<String, Rejection> {
        Ok(self.tenant)
    }

    #[rate_limit(period = 60, threshold = 10, key = tenant, limiter = limiter)]
    async fn for_tenant(limiter: &Limiter, tenant: &str) -> Result<usize, Rejection> {
        Ok(tenant.len())
    }
}

trait Store {
    async fn load(&self, id: u32) -> Result<u32, Rejection>;
}

impl Store for Service {
    #[rate_limit(period = 60, threshold = 10, key = id, limiter = self.limiter, name = "store_load")]
    async fn load(&self, id: u32) -> Result<u32, Rejection> {
        Ok(id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    let mut service = Service {
        tenant: "acme".to_owned(),
        limiter: limiter.clone(),
        calls: 0,
    };
    assert_eq!(service.bump().await.unwrap(), 1);
    assert_eq!(service.get(1).await.unwrap(), 2);
    assert_eq!(service.load(5).await.unwrap(), 5);
    assert_eq!(Service::for_tenant(&limiter, "acme").await.unwrap(), 4);
    assert_eq!(service.finish().await.unwrap(), "acme");
}
