//! The `http` handler: one `POST` per task (to be written).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Job, Ran};

/// A queue's `http` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSpec {
    /// Where each task is posted (http or https).
    pub url: String,
    /// The whole request, from connecting to the last byte of the answer.
    pub timeout: Duration,
    /// The most bytes of a 2xx body kept as the output; over it the attempt fails.
    pub max_output: usize,
}

/// The daemon's one HTTP client: keep-alive connections shared by every `http` queue.
#[derive(Debug, Clone)]
pub struct HttpClient {}

impl HttpClient {
    /// Build the client (rustls, the system's roots).
    pub fn new() -> Result<Self, String> {
        Ok(HttpClient {})
    }

    /// Post `payload` for `job` to `spec.url`.
    pub async fn post(
        &self,
        spec: &HttpSpec,
        job: &Job,
        payload: bytes::Bytes,
        cancel: &CancellationToken,
    ) -> Ran {
        let _ = (spec, job, payload, cancel);
        todo!("http handler")
    }
}
