//! A headless Chromium driven over WebDriver: Debian's `chromedriver` (package
//! `chromium-driver`) as a process of the test's own, on a free port, and a `fantoccini`
//! session on it. Every call goes through [`Browser`], each under the tests' deadline.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

use crate::support::{eventually, free_port, within, WAIT};

/// The `chromedriver` command, or a failure saying how to install it.
pub fn chromedriver() -> std::path::PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromedriver"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the dashboard's console tests click through Chromium with chromedriver: install \
             it with `apt-get install -y chromium-driver` (.ci/run does)"
        )
    })
}

/// A Chromium session: its chromedriver, killed when dropped, and the WebDriver client.
pub struct Browser {
    client: Client,
    _driver: tokio::process::Child,
}

impl Browser {
    /// Start chromedriver and a headless Chromium of `width` × `height` pixels.
    pub async fn start(width: u32, height: u32) -> Browser {
        let chromium = super::chromium();
        let port = free_port();
        let driver = tokio::process::Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        let http = reqwest::Client::new();
        eventually(WAIT, "chromedriver to answer", || {
            let request = http.get(&status).timeout(Duration::from_secs(2)).send();
            async move { request.await.ok().filter(|r| r.status().is_success()) }
        })
        .await;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium.display().to_string(),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                ],
            }),
        );
        let client = within(
            WAIT,
            "a WebDriver session",
            ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities)
                .connect(&url),
        )
        .await
        .expect("chromedriver opens a Chromium session");
        Browser {
            client,
            _driver: driver,
        }
    }

    /// Go to `url` (a change of the fragment alone does not reload the page).
    pub async fn goto(&self, url: &str) {
        within(WAIT, url, self.client.goto(url))
            .await
            .unwrap_or_else(|err| panic!("cannot open {url}: {err}"));
    }

    /// The value of `script`'s `return`.
    pub async fn eval(&self, script: &str) -> Value {
        within(WAIT, script, self.client.execute(script, vec![]))
            .await
            .unwrap_or_else(|err| panic!("{script}: {err}"))
    }

    /// Wait until `script` returns something other than `null`, `false` or `""`; that value.
    pub async fn wait_for(&self, what: &str, script: &str) -> Value {
        eventually(WAIT, what, || async {
            let value = self.client.execute(script, vec![]).await.ok()?;
            match &value {
                Value::Null | Value::Bool(false) => None,
                Value::String(text) if text.is_empty() => None,
                _ => Some(value),
            }
        })
        .await
    }

    /// Click the element that `css` selects.
    pub async fn click(&self, css: &str) {
        let element = within(WAIT, css, self.client.find(Locator::Css(css)))
            .await
            .unwrap_or_else(|err| panic!("no {css}: {err}"));
        within(WAIT, css, element.click())
            .await
            .unwrap_or_else(|err| panic!("cannot click {css}: {err}"));
    }

    /// Choose the option of value `value` in the `<select>` that `css` selects.
    pub async fn select(&self, css: &str, value: &str) {
        let element = within(WAIT, css, self.client.find(Locator::Css(css)))
            .await
            .unwrap_or_else(|err| panic!("no {css}: {err}"));
        within(WAIT, css, element.select_by_value(value))
            .await
            .unwrap_or_else(|err| panic!("cannot choose {value} in {css}: {err}"));
    }

    /// Accept the `confirm()` the page shows, after checking its text holds `needle`.
    pub async fn confirm(&self, needle: &str) {
        let text = eventually(WAIT, "a confirm dialog", || async {
            self.client.get_alert_text().await.ok()
        })
        .await;
        assert!(text.contains(needle), "the dialog says {text:?}");
        within(WAIT, "accepting the dialog", self.client.accept_alert())
            .await
            .expect("the dialog is accepted");
    }

    /// Resize the window so that the page's viewport is `width` pixels wide.
    pub async fn resize(&self, width: u32, height: u32) {
        within(
            WAIT,
            "resizing the window",
            self.client.set_window_size(width, height),
        )
        .await
        .expect("the window is resized");
        let inner = self.eval("return window.innerWidth").await;
        if let Some(inner) = inner.as_u64() {
            // The window's frame, if any, is outside the viewport: make up for it.
            if inner != u64::from(width) {
                let frame = u32::try_from(u64::from(width).abs_diff(inner)).unwrap();
                within(
                    WAIT,
                    "resizing the window",
                    self.client.set_window_size(width + frame, height),
                )
                .await
                .expect("the window is resized");
            }
        }
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        within(WAIT, "a screenshot", self.client.screenshot())
            .await
            .expect("a screenshot")
    }

    /// End the session (and Chromium); chromedriver ends when dropped.
    pub async fn close(self) {
        let _ = within(WAIT, "closing the browser", self.client.close()).await;
    }
}
