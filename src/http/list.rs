//! `GET /tasks?queue=&status=&limit=&after=`: a page of tasks, newest first, each as `GET
//! /tasks/{id}` shows it but without its payload (its size and first 200 characters instead),
//! read by `queue::page`.
//!
//! Paging is by key, not offset: the answer's `next` is the last id of the page when more
//! rows follow (`null` at the end), and `after=<next>` asks for the rows below it. A page
//! deep in a table of a million rows costs what the first one does (docs/http.md, "Listing
//! tasks"), and rows inserted meanwhile never shift a page nor repeat a row.

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::Db;
use crate::queue::{self, ListFilter, Page, TaskStatus};

/// The most rows a page holds.
const MAX_LIMIT: i64 = 500;
/// The rows of a page when no `limit` is given.
const DEFAULT_LIMIT: i64 = 50;

/// The query of `GET /tasks`; other parameters are ignored. Each is taken as text, so that a
/// bad one is 400 with its own rule.
#[derive(Debug, Deserialize)]
pub(super) struct ListParams {
    queue: Option<String>,
    status: Option<String>,
    limit: Option<String>,
    after: Option<String>,
}

impl ListParams {
    /// The filter the parameters ask for, each checked: `queue` a queue name (exact), `status`
    /// one of the six in any case, `limit` 1 to [`MAX_LIMIT`], `after` a task id.
    fn filter(self) -> Result<ListFilter, ApiError> {
        if let Some(queue) = &self.queue {
            queue::enqueue::check_queue_name(queue)?;
        }
        let status = self
            .status
            .map(|s| {
                s.to_ascii_uppercase().parse::<TaskStatus>().map_err(|_| {
                    ApiError::BadRequest(
                        "status must be waiting, queued, running, succeeded, failed or canceled"
                            .into(),
                    )
                })
            })
            .transpose()?;
        let limit = match self.limit {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::BadRequest(format!("limit must be a number from 1 to {MAX_LIMIT}"))
                })?,
        };
        let after = self
            .after
            .map(|text| {
                text.parse::<i64>().map_err(|_| {
                    ApiError::BadRequest(
                        "after must be the next of the previous page (a task id)".into(),
                    )
                })
            })
            .transpose()?;
        Ok(ListFilter {
            queue: self.queue,
            status,
            limit,
            after,
        })
    }
}

/// `GET /tasks`: `{"tasks": [...], "next": id or null}`, newest first.
pub(super) async fn list(
    params: Result<Query<ListParams>, QueryRejection>,
    Db(session): Db,
) -> Result<Json<Page>, ApiError> {
    let Query(params) = params.map_err(|err| ApiError::BadRequest(err.body_text()))?;
    let filter = params.filter()?;
    Ok(Json(session.bounded(queue::page(&session, &filter)).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(
        queue: Option<&str>,
        status: Option<&str>,
        limit: Option<&str>,
        after: Option<&str>,
    ) -> ListParams {
        ListParams {
            queue: queue.map(str::to_string),
            status: status.map(str::to_string),
            limit: limit.map(str::to_string),
            after: after.map(str::to_string),
        }
    }

    #[test]
    fn parameters_are_checked_each_by_its_rule() {
        let filter = params(None, None, None, None).filter().unwrap();
        assert_eq!((filter.limit, filter.after), (DEFAULT_LIMIT, None));
        let filter = params(Some("mail"), Some("Failed"), Some("500"), Some("42"))
            .filter()
            .unwrap();
        assert_eq!(filter.status, Some(TaskStatus::Failed));
        assert_eq!((filter.limit, filter.after), (500, Some(42)));
        for (bad, field) in [
            (params(None, Some("done"), None, None), "status"),
            (params(None, None, Some("0"), None), "limit"),
            (params(None, None, Some("501"), None), "limit"),
            (params(None, None, None, Some("x")), "after"),
            (params(Some(""), None, None, None), "queue"),
        ] {
            let err = bad.filter().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
