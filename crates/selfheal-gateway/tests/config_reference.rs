//! `docs/reference/config.md` is checked against the configuration types: every table there
//! lists exactly the keys the gateway accepts, and every default written as a TOML value is the
//! one a config without the key gets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use selfheal_gateway::GatewayConfig;

const UPSTREAM: &str = "[upstreams.u]\nbase_url = \"http://127.0.0.1:1/v1\"\n";

/// One documented table: its path as the page names it, and its rows as (key, default), the
/// default only when written as a TOML value in backticks.
struct Table {
    path: String,
    rows: Vec<(String, Option<String>)>,
}

/// The tables of the page: a `### ...` heading, then a Markdown table whose first column is a
/// key in backticks and whose third is its default.
fn tables(md: &str) -> Vec<Table> {
    let mut out: Vec<Table> = Vec::new();
    for line in md.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            let path = if h.trim() == "Top level" {
                String::new()
            } else {
                h.trim()
                    .trim_matches('`')
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .trim_matches(|c| c == '[' || c == ']')
                    .to_owned()
            };
            out.push(Table {
                path,
                rows: Vec::new(),
            });
            continue;
        }
        let Some(table) = out.last_mut() else {
            continue;
        };
        if !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(cells.len() >= 4, "a row without four cells: {line}");
        let key = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_owned();
        let default = cells[2].trim();
        let literal = default.len() > 2
            && default.starts_with('`')
            && default.ends_with('`')
            && default.matches('`').count() == 2;
        let default = literal.then(|| default.trim_matches('`').to_owned());
        table.rows.push((key, default));
    }
    out
}

/// A config whose table `path` holds `body` (and whatever that table needs to be valid).
fn config(path: &str, body: &str) -> String {
    match path {
        "" => body.to_owned(),
        "upstreams.NAME" => format!("[upstreams.u]\nbase_url = \"http://127.0.0.1:1/v1\"\n{body}"),
        "models.NAME" => {
            format!("{UPSTREAM}[models.m]\nchain = [{{upstream = \"u\", model = \"x\"}}]\n{body}")
        }
        "models.NAME.chain" => {
            format!("{UPSTREAM}[[models.m.chain]]\nupstream = \"u\"\nmodel = \"x\"\n{body}")
        }
        "tools.NAME" => format!("[tools.t]\n{body}"),
        other => format!("[{other}]\n{body}"),
    }
}

/// The keys the table accepts, read from the error for a key it does not know.
fn accepted_keys(path: &str) -> BTreeSet<String> {
    let err = GatewayConfig::from_toml_str(&config(path, "zz_not_a_key = 1\n"))
        .err()
        .unwrap_or_else(|| panic!("[{path}] accepted an unknown key"))
        .to_string();
    let at = err
        .find("unknown field `zz_not_a_key`, expected")
        .unwrap_or_else(|| panic!("[{path}]: unexpected error {err}"));
    let tail = &err[at + "unknown field `zz_not_a_key`, expected".len()..];
    let tail = tail.lines().next().unwrap_or("");
    tail.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_table_lists_exactly_the_accepted_keys_and_their_defaults() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/reference/config.md"
    );
    let md = std::fs::read_to_string(path).unwrap();
    let tables = tables(&md);
    let paths: Vec<&str> = tables.iter().map(|t| t.path.as_str()).collect();
    for want in [
        "",
        "upstreams.NAME",
        "models.NAME",
        "models.NAME.chain",
        "server",
        "limits",
        "limits.degenerate",
        "monitor",
        "budget",
        "policy",
        "policy.retry",
        "tools.NAME",
    ] {
        assert!(
            paths.contains(&want),
            "config.md has no table for [{want}]: {paths:?}"
        );
    }
    let mut checked_defaults = 0;
    for table in &tables {
        let documented: BTreeSet<String> = table.rows.iter().map(|(k, _)| k.clone()).collect();
        let mut accepted = accepted_keys(&table.path);
        if table.path == "upstreams.NAME" {
            // An alias: serde lists only the field's own name.
            accepted.insert("timeout_ms".to_owned());
        }
        assert_eq!(
            documented, accepted,
            "config.md's [{}] and the keys the gateway accepts differ",
            table.path
        );
        let without = GatewayConfig::from_toml_str(&config(&table.path, "")).unwrap();
        for (key, default) in &table.rows {
            let Some(default) = default else { continue };
            let with =
                GatewayConfig::from_toml_str(&config(&table.path, &format!("{key} = {default}\n")))
                    .unwrap_or_else(|e| panic!("[{}] {key} = {default}: {e}", table.path));
            assert!(
                with == without,
                "config.md says [{}] {key} defaults to {default}, but setting it changes the config",
                table.path
            );
            checked_defaults += 1;
        }
    }
    assert!(
        checked_defaults >= 40,
        "only {checked_defaults} defaults were checked"
    );
}

/// The check above can fail: a wrong default is caught.
#[test]
fn a_wrong_default_changes_the_config() {
    let without = GatewayConfig::from_toml_str("[server]\n").unwrap();
    let with = GatewayConfig::from_toml_str("[server]\nmax_connections = 1023\n").unwrap();
    assert!(with != without);
}

/// The ```toml blocks of a page of the book.
fn toml_blocks(page: &str) -> Vec<String> {
    let path = format!("{}/../../docs/{page}", env!("CARGO_MANIFEST_DIR"));
    let md = std::fs::read_to_string(&path).unwrap();
    md.split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or("").to_owned())
        .collect()
}

/// The configuration the gateway guide shows and the policy the policies guide shows are
/// accepted as written.
#[test]
fn the_guides_toml_examples_are_accepted() {
    let configs = toml_blocks("guides/gateway.md");
    assert!(
        !configs.is_empty(),
        "the gateway guide shows no configuration"
    );
    for block in &configs {
        GatewayConfig::from_toml_str(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    }
    let policies = toml_blocks("guides/policies.md");
    assert!(!policies.is_empty(), "the policies guide shows no policy");
    for block in &policies {
        selfheal_core::Policy::from_toml_str(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    }
}
