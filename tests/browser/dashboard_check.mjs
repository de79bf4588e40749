#!/usr/bin/env node
// Opens the memstream dashboard in a real headless Chromium (the system one: Debian's
// `chromium` package, no Playwright browser download) and waits until one projection's row
// shows the expected lag and state. Prints one JSON object on stdout; exit code 0 when the row
// matched, 1 when it did not within the timeout, 2 on bad arguments or a browser that would not start.
//
//   MEMSTREAM_OPS_TOKEN=... node dashboard_check.mjs --url http://127.0.0.1:8080 --projection lexical --lag 12 \
//        --state paused [--screenshot out.png] [--timeout 60000] [--chromium /usr/bin/chromium]
//
// The dashboard first shows its sign-in page: the script types the ops token (read from the
// environment, never from the command line) into it, as a person would, and submits.
//
// Driven by tests/e2e/test_dashboard_browser.py, which does the HTTP steps (pause, publish,
// /metrics) and asserts on the JSON printed here.
import { chromium } from "playwright-core";
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    url: { type: "string" },
    projection: { type: "string" },
    lag: { type: "string" },
    state: { type: "string" },
    screenshot: { type: "string" },
    timeout: { type: "string", default: "60000" },
    chromium: { type: "string", default: process.env.MEMSTREAM_CHROMIUM || "/usr/bin/chromium" },
  },
});

function done(code, result) {
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(code);
}

if (!opts.url || !opts.projection || opts.lag === undefined || !["paused", "running"].includes(opts.state)) {
  done(2, { ok: false, error: "usage: --url URL --projection NAME --lag N --state paused|running [--screenshot PATH] [--timeout MS]" });
}
const want = { name: opts.projection, lag: String(Number(opts.lag)), state: opts.state };
const timeout = Number(opts.timeout);

// Everything the page tells us about one projection, the charts and when it last rendered.
function observe(name) {
  const row = document.querySelector(`#projections tr[data-projection="${name}"]`);
  const text = sel => (row && row.querySelector(sel) ? row.querySelector(sel).textContent.trim() : null);
  const charts = {};
  for (const svg of document.querySelectorAll("svg.chart")) {
    charts[svg.id] = [...svg.querySelectorAll("polyline")].map(p => p.dataset.series);
  }
  return {
    found: Boolean(row),
    lag_events: text(".lag-events"),
    lag_seconds: text(".lag-seconds"),
    status: text(".status"),
    state: text(".state"),
    projections: [...document.querySelectorAll("#projections tr[data-projection]")].map(r => r.dataset.projection),
    updated: document.body.dataset.updated || null,
    meta: document.getElementById("meta")?.textContent ?? null,
    freshness: document.getElementById("freshness")?.textContent ?? null,
    forgets_pending: document.getElementById("forgets-pending")?.textContent ?? null,
    forgets_summary: document.getElementById("forgets-summary")?.textContent ?? null,
    retention: [...document.querySelectorAll("#retention tr[data-tenant]")].map(r => r.dataset.tenant),
    charts,
  };
}

const started = Date.now();
const consoleErrors = [];
const failedRequests = [];  // "404 /favicon.ico", "failed /v1/ops/snapshot: net::ERR_..."
let browser;
try {
  browser = await chromium.launch({
    executablePath: opts.chromium,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"],
    timeout,
  });
} catch (err) {
  done(2, { ok: false, error: `could not start Chromium at ${opts.chromium}: ${err.message}` });
}

let code = 1;
let result = { ok: false, want };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", msg => { if (msg.type() === "error") consoleErrors.push(msg.text()); });
  page.on("pageerror", err => consoleErrors.push(`pageerror: ${err.message}`));
  page.on("response", r => { if (r.status() >= 400) failedRequests.push(`${r.status()} ${new URL(r.url()).pathname}`); });
  page.on("requestfailed", r => failedRequests.push(`failed ${new URL(r.url()).pathname}: ${r.failure()?.errorText}`));
  const response = await page.goto(new URL("/dashboard", opts.url).href, { waitUntil: "load", timeout });
  result.http_status = response ? response.status() : null;
  if (await page.$("#signin")) {
    result.signed_in = true;
    await page.fill("#token", process.env.MEMSTREAM_OPS_TOKEN || "");
    await Promise.all([page.waitForSelector("#projections", { timeout }), page.click("#signin button[type=submit]")]);
  }
  try {
    await page.waitForFunction(({ name, lag, state }) => {
      const row = document.querySelector(`#projections tr[data-projection="${name}"]`);
      return Boolean(row) && row.querySelector(".lag-events")?.textContent.trim() === lag
        && row.querySelector(".state")?.textContent.trim() === state;
    }, want, { timeout, polling: 200 });
    // One more render after the match, so the charts include the sample that matched.
    const seen = await page.evaluate(() => document.body.dataset.updated);
    await page.waitForFunction(prev => document.body.dataset.updated !== prev, seen, { timeout, polling: 200 });
    result.ok = true;
    code = 0;
  } catch (err) {
    result.error = `dashboard did not show ${want.name} lag ${want.lag} ${want.state} within ${timeout} ms: ${err.message.split("\n")[0]}`;
  }
  Object.assign(result, await page.evaluate(observe, want.name));
  if (opts.screenshot) {
    await page.screenshot({ path: opts.screenshot, fullPage: true });
    result.screenshot = opts.screenshot;
  }
} catch (err) {
  result.error = `browser error: ${err.message}`;
  code = 1;
} finally {
  result.console_errors = consoleErrors;
  result.failed_requests = failedRequests;
  result.elapsed_ms = Date.now() - started;
  result.browser_version = browser.version();
  await browser.close().catch(() => {});
}
done(code, result);
