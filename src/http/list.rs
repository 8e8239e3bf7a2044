//! `GET /tasks?queue=&status=&tag=&meta=&limit=&after=`: a page of tasks, newest first, each
//! as `GET /tasks/{id}` shows it but without its payload (its size and first 200 characters
//! instead) and metadata, read by `queue::page`. `tag=T` and `meta=KEY:VALUE` may be repeated:
//! a task must have every tag and metadata term.
//!
//! Paging is by key, not offset: the answer's `next` is the last id of the page when more
//! rows follow (`null` at the end), and `after=<next>` asks for the rows below it. A page
//! deep in a table of a million rows costs what the first one does (docs/http.md, "Listing
//! tasks"), and rows inserted meanwhile never shift a page nor repeat a row.

use axum::extract::RawQuery;
use axum::Json;

use super::error::ApiError;
use super::extract::Db;
use crate::queue::{self, ListFilter, Page, TaskStatus};

/// The most rows a page holds.
const MAX_LIMIT: i64 = 500;
/// The rows of a page when no `limit` is given.
const DEFAULT_LIMIT: i64 = 50;

/// The query of `GET /tasks`; other parameters are ignored. Each is taken as text, so that a
/// bad one is 400 with its own rule; `tag` and `meta` may be repeated (every term must hold),
/// the others are given once.
#[derive(Debug, Default)]
pub(super) struct ListParams {
    queue: Option<String>,
    status: Option<String>,
    limit: Option<String>,
    after: Option<String>,
    tags: Vec<String>,
    meta: Vec<String>,
}

impl ListParams {
    /// The parameters of `query` (percent-decoded, `+` a space, as a form's): 400 for one of
    /// the four single ones given twice.
    fn parse(query: Option<&str>) -> Result<ListParams, ApiError> {
        let mut params = ListParams::default();
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let slot = match &*name {
                "queue" => &mut params.queue,
                "status" => &mut params.status,
                "limit" => &mut params.limit,
                "after" => &mut params.after,
                "tag" => {
                    params.tags.push(value.into_owned());
                    continue;
                }
                "meta" => {
                    params.meta.push(value.into_owned());
                    continue;
                }
                // A misspelt filter (`staus`, or `tags` for `tag`) would list every task, and
                // a script acting on the list would act on all of them: refused, as
                // `POST /tasks` refuses one.
                other => {
                    return Err(ApiError::BadRequest(format!(
                        "unknown query parameter {other:?}: GET /tasks takes queue, status, \
                         tag, meta, limit and after"
                    )))
                }
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(ApiError::BadRequest(format!(
                    "the query parameter {name} is given twice"
                )));
            }
        }
        Ok(params)
    }

    /// The filter the parameters ask for, each checked: `queue` a queue name (exact), `status`
    /// one of the six in any case, `limit` 1 to [`MAX_LIMIT`], `after` a task id, each `tag`
    /// a tag, each `meta` `KEY:VALUE` (split at the first colon; each key once).
    fn filter(self) -> Result<ListFilter, ApiError> {
        if let Some(queue) = &self.queue {
            queue::enqueue::check_queue_name(queue)?;
        }
        // A filter's term is a query parameter: 400, where a task's tags are 422.
        let bad = |err: queue::enqueue::BadInput| ApiError::BadRequest(err.to_string());
        queue::enqueue::check_tags(&self.tags).map_err(bad)?;
        let pairs = self
            .meta
            .iter()
            .map(|term| queue::enqueue::parse_meta_term(term, ':'))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        let metadata = queue::enqueue::Metadata::from_pairs(&pairs).map_err(bad)?;
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
            tags: self.tags,
            metadata,
        })
    }
}

/// `GET /tasks`: `{"tasks": [...], "next": id or null}`, newest first.
pub(super) async fn list(
    RawQuery(query): RawQuery,
    Db(session): Db,
) -> Result<Json<Page>, ApiError> {
    let filter = ListParams::parse(query.as_deref())?.filter()?;
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
            ..ListParams::default()
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

    #[test]
    fn tags_and_meta_terms_repeat_and_the_rest_come_once() {
        let filter = ListParams::parse(Some(
            "tag=a&tag=b%3Ac&meta=owner:ann:x&meta=team%3Aops&status=failed",
        ))
        .unwrap()
        .filter()
        .unwrap();
        assert_eq!(filter.tags, ["a", "b:c"]);
        assert_eq!(
            queue::enqueue::jsonb_text(filter.metadata.unwrap().as_str()).unwrap(),
            r#"{"team": "ops", "owner": "ann:x"}"#
        );
        assert_eq!(filter.status, Some(TaskStatus::Failed));
        for (query, says) in [
            ("limit=1&limit=2", "limit is given twice"),
            ("tag=a%20b", "tag \"a b\""),
            ("meta=owner", "meta \"owner\" is not KEY:VALUE"),
            ("meta=k:a&meta=k:b", "key \"k\" is given twice"),
            ("status=failed&other=1", "unknown query parameter \"other\""),
        ] {
            let err = ListParams::parse(Some(query))
                .and_then(ListParams::filter)
                .unwrap_err();
            assert!(matches!(err, ApiError::BadRequest(_)), "{query}: {err:?}");
            assert!(err.to_string().contains(says), "{query}: {err}");
        }
    }
}
