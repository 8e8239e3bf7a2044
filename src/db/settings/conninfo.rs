//! Reading a libpq connection string, URL (`postgres://...`) or keywords (`host=... user=...`),
//! as far as tokio-postgres cannot: it knows neither `sslrootcert` nor the `sslmode` values
//! beyond `disable`, `prefer` and `require`, so [`split`] takes those two out before the rest
//! goes to its parser, and `target_session_attrs` with them (see [`Split`]). [`quote`] writes
//! a value back in keyword syntax.
//!
//! Everything else passes through unchanged, host lists included: tokio-postgres reads
//! `host=a,b port=5432,5433` and `postgresql://a:5432,b:5433/db` as libpq does, hosts tried in
//! order. Two rewrites keep libpq's meaning where tokio-postgres's URL parser differs: a
//! `?host=a,b` parameter becomes `?host=a&host=b` (each `host` parameter adds one host), and
//! a URL's single host without a port moves into a `host` parameter, so that the port stays
//! unset and `PGPORT` can fill it.

/// The TLS options and `target_session_attrs` found in a connection string, and the string
/// without them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub rest: String,
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    /// Taken out so that a value in the string can be told from none (then
    /// `PGTARGETSESSIONATTRS` applies, as in libpq), and so that libpq's values that
    /// tokio-postgres does not know are refused with a reason rather than a parse error.
    pub target_session_attrs: Option<String>,
}

/// Take `sslmode`, `sslrootcert` and `target_session_attrs` out of a URL or key=value
/// connection string. A string this cannot read is returned whole, for tokio-postgres to
/// report its error.
pub fn split(conninfo: &str) -> Split {
    let whole = || Split {
        rest: conninfo.to_string(),
        ..Split::default()
    };
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        return split_url(conninfo).unwrap_or_else(whole);
    }
    let Some(pairs) = keyword_pairs(conninfo) else {
        return whole();
    };
    let mut split = Split::default();
    let mut kept = Vec::new();
    for (key, value) in pairs {
        match key.as_str() {
            "sslmode" => split.sslmode = Some(value),
            "sslrootcert" => split.sslrootcert = Some(value),
            "target_session_attrs" => split.target_session_attrs = Some(value),
            _ => kept.push(quote(&key, &value)),
        }
    }
    split.rest = kept.join(" ");
    split
}

/// `key='value'`, with the value's backslashes and single quotes escaped as libpq reads them.
pub fn quote(key: &str, value: &str) -> String {
    format!(
        "{key}='{}'",
        value.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

fn split_url(url: &str) -> Option<Split> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut split = Split::default();
    let mut kept = Vec::new();
    let base = match portless_host(base) {
        Some((without, host)) => {
            kept.push(format!("host={host}"));
            without
        }
        None => base.to_string(),
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => split.sslmode = Some(percent_decode(value)?),
            "sslrootcert" => split.sslrootcert = Some(percent_decode(value)?),
            "target_session_attrs" => split.target_session_attrs = Some(percent_decode(value)?),
            // A literal comma separates hosts; an encoded one (%2C) stays part of a name.
            "host" => kept.extend(value.split(',').map(|host| format!("host={host}"))),
            _ => kept.push(pair.to_string()),
        }
    }
    split.rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Some(split)
}

/// A URL naming one host and no port, split into the URL without the host and the host.
///
/// libpq leaves the port unset for such a URL, so that `PGPORT` applies; tokio-postgres's URL
/// parser would set 5432. A host given as a `host` parameter sets no port, so [`split_url`]
/// moves it there. Host lists are left alone: for them libpq also takes 5432 where a port is
/// missing, whatever `PGPORT` says.
fn portless_host(base: &str) -> Option<(String, String)> {
    let start = base.find("://")? + 3;
    let authority_end = base[start..]
        .find('/')
        .map_or(base.len(), |end| start + end);
    let host_start = base[start..authority_end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    let host = &base[host_start..authority_end];
    let host = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    if host.is_empty() || host.contains(',') {
        return None;
    }
    let without = format!("{}{}", &base[..host_start], &base[authority_end..]);
    Some((without, host.to_string()))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `key = value` pairs of a libpq keyword string (values may be single-quoted, with
/// backslash escapes).
fn keyword_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Some(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        chars.next_if_eq(&'=')?;
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\\' => value.push(chars.next()?),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next()?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::Host;

    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_a_url() {
        let found = split("postgres://u:p@db.example:5433/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(
            found.rest,
            "postgres://u:p@db.example:5433/app?application_name=x"
        );
        assert_eq!(found.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(found.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let plain = split("postgresql://localhost:5432/app");
        assert_eq!(plain.rest, "postgresql://localhost:5432/app");
        assert_eq!(plain.sslmode, None);
    }

    #[test]
    fn tls_options_are_taken_out_of_a_keyword_string() {
        let found =
            split("host=db user='it''s' sslmode = verify-ca  sslrootcert='/my ca.pem' dbname=app");
        assert_eq!(
            found.sslmode, None,
            "a doubled quote is not libpq syntax: the string is left whole"
        );
        let found = split(
            "host=db user='o\\'brien' sslmode = verify-ca  sslrootcert='/my ca.pem' dbname=app",
        );
        assert_eq!(found.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(found.sslrootcert.as_deref(), Some("/my ca.pem"));
        assert_eq!(found.rest, "host='db' user='o\\'brien' dbname='app'");
        let config: tokio_postgres::Config = found.rest.parse().unwrap();
        assert_eq!(config.get_user(), Some("o'brien"));
    }

    #[test]
    fn host_lists_survive_in_both_forms() {
        let found = split(
            "host=a.example,b.example port=5432,5433 user=u sslmode=require \
             target_session_attrs=read-write",
        );
        assert_eq!(found.sslmode.as_deref(), Some("require"));
        assert_eq!(found.target_session_attrs.as_deref(), Some("read-write"));
        let config: tokio_postgres::Config = found.rest.parse().unwrap();
        assert_eq!(
            config.get_hosts(),
            &[Host::Tcp("a.example".into()), Host::Tcp("b.example".into())]
        );
        assert_eq!(config.get_ports(), &[5432, 5433]);

        let found = split(
            "postgresql://u@a.example:5432,b.example:5433/app?sslmode=verify-full&target_session_attrs=any",
        );
        assert_eq!(found.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(found.target_session_attrs.as_deref(), Some("any"));
        assert_eq!(
            found.rest,
            "postgresql://u@a.example:5432,b.example:5433/app"
        );
        let config: tokio_postgres::Config = found.rest.parse().unwrap();
        assert_eq!(
            config.get_hosts(),
            &[Host::Tcp("a.example".into()), Host::Tcp("b.example".into())]
        );
        assert_eq!(config.get_ports(), &[5432, 5433]);
        assert_eq!(config.get_dbname(), Some("app"));
    }

    #[test]
    fn a_host_list_in_a_url_parameter_becomes_one_host_each() {
        let found = split("postgresql:///app?host=a.example,%2Frun%2Fpg&port=5432,5433");
        assert_eq!(
            found.rest,
            "postgresql:///app?host=a.example&host=%2Frun%2Fpg&port=5432,5433"
        );
        let config: tokio_postgres::Config = found.rest.parse().unwrap();
        assert_eq!(
            config.get_hosts(),
            &[Host::Tcp("a.example".into()), Host::Unix("/run/pg".into())]
        );
        assert_eq!(config.get_ports(), &[5432, 5433]);
    }

    #[test]
    fn a_url_with_one_host_and_no_port_leaves_the_port_unset_as_libpq_does() {
        for (url, rest, host) in [
            (
                "postgres://u:p@db.example/app?application_name=x",
                "postgres://u:p@/app?host=db.example&application_name=x",
                Host::Tcp("db.example".into()),
            ),
            (
                "postgresql://[::1]/app",
                "postgresql:///app?host=::1",
                Host::Tcp("::1".into()),
            ),
            (
                "postgresql://%2Frun%2Fpg",
                "postgresql://?host=%2Frun%2Fpg",
                Host::Unix("/run/pg".into()),
            ),
        ] {
            let found = split(url);
            assert_eq!(found.rest, rest);
            let config: tokio_postgres::Config = found.rest.parse().unwrap();
            assert_eq!(config.get_hosts(), &[host], "{url}");
            assert!(config.get_ports().is_empty(), "{url}: PGPORT may fill it");
        }
        for url in [
            "postgres://db.example:6543/app",
            "postgres://[::1]:6543/app",
            "postgres://a.example,b.example/app",
            "postgres:///app",
        ] {
            assert_eq!(split(url).rest, url, "left alone");
        }
    }

    #[test]
    fn a_quoted_value_reads_back_as_itself() {
        let text = quote("password", "it's a \\ secret");
        assert_eq!(text, "password='it\\'s a \\\\ secret'");
        let config: tokio_postgres::Config = text.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's a \\ secret"[..]));
    }
}
