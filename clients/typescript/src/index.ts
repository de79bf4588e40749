// A thin client for memstream's HTTP API. The request and result types are generated from the API's OpenAPI
// document into src/api.ts (`npm run generate` reads the repository's docs/openapi.json), so they follow the
// server; this file only adds the calls, retries and errors.
//
// Retries: 429 and 503 (the server says "later") and network failures are retried with exponential back-off
// and full jitter, never sooner than a Retry-After the server sent. Every call is safe to repeat: `add` gives
// each turn an event id before the first attempt (the views keep one turn per id), a repeated forget forgets
// nothing more, reads change nothing. A wait that runs out is an answer (WaitTimeout), not a failure: it is
// never retried.

import { randomUUID } from "node:crypto";
import type { components } from "./api.js";

/** Every path and schema of the API, for the calls this client does not wrap. */
export type { components, paths } from "./api.js";

type Schemas = components["schemas"];
export type SearchBody = Schemas["SearchBody"];
export type SearchResponse = Schemas["SearchResponse"];
/** One unit of evidence: its `score` (comparable within one response only) and `role` say why it is there. */
export type Evidence = Schemas["Evidence"];
export type EvidenceRole = Evidence["role"];
export type TurnRef = Schemas["TurnRef"];
export type TurnRecorded = Schemas["TurnRecorded"];
export type EventsResult = Schemas["EventsResult"];
export type ForgetBody = Schemas["ForgetBody"];
export type ForgetResult = Schemas["ForgetResult"];
/** Partition -> offset, as `add` and `forget` return them. */
export type Positions = Record<string, number>;

/** A turn to add: only conversation_id, speaker and text are needed. */
export type TurnInput = Partial<Omit<TurnRecorded, "type">>
  & Pick<TurnRecorded, "conversation_id" | "speaker" | "text">;

/**
 * What a search takes besides the question. Every field is optional: one left out is not sent, and the server's
 * default applies. Two are easily confused:
 * - `max_turns` is the results' limit: evidence units are added in rank order until they hold this many distinct
 *   turns (the last unit may be cut). Left out, the server's default applies (SearchBody's `@default`).
 * - `k` is how many of the best fused units seed the evidence as `primary`, before closure and fill. It does not
 *   limit the results.
 */
export type SearchOptions = Partial<Omit<SearchBody, "question">>;

export interface ClientOptions {
  /** Default: $MEMSTREAM_URL, else http://127.0.0.1:8080. */
  url?: string;
  /** Default: $MEMSTREAM_API_KEY. */
  apiKey?: string;
  /** Attempts in all (1: no retry). Default 5. */
  attempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
  /**
   * How long one HTTP attempt may take (default 30 000). A wait's attempt is given its wait's time on top of this,
   * so a wait longer than the timeout ends as the server's answer, not as a transport error.
   */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

/** An error answered by the API (its error shape), or a network failure (status 0). */
export class MemstreamError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string | null = null,
    readonly details: unknown[] = [],
    readonly requestId: string | null = null,
  ) {
    super(message);
    this.name = "MemstreamError";
  }
}

/** The views did not reach the positions within the wait's timeout (`caught_up: false`). Never retried. */
export class WaitTimeout extends MemstreamError {
  constructor(message: string, code: string | null, details: unknown[], requestId: string | null) {
    super(message, 504, code, details, requestId);
    this.name = "WaitTimeout";
  }
}

const VERSION = "0.2.0"; // package.json's version: the package test holds them together
const RETRY_STATUSES = new Set([429, 503]);
/** The longest wait the API takes in one request; a longer wait is several requests. */
const MAX_WAIT_SECONDS = 300;

type ErrorShape = { error?: { code?: string; message?: string; details?: unknown[]; request_id?: string } } | null;

/** What one attempt sends: built again for each attempt, so a retried wait asks only for the time it has left. */
interface Attempt {
  body?: unknown;
  timeoutMs: number;
}

function retryAfterMs(value: string | null): number | null {
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - Date.now());
}

function agentOf(speaker: string): string {
  const cleaned = speaker.trim().replace(/[^A-Za-z0-9._:@-]/g, "-").slice(0, 200).replace(/^-+|-+$/g, "");
  return cleaned || "agent";
}

function errorOf(response: Response, parsed: unknown, text: string): MemstreamError {
  const error = (parsed as ErrorShape)?.error;
  const message = error?.message ?? `HTTP ${response.status}: ${text.slice(0, 300)}`;
  const requestId = error?.request_id ?? response.headers.get("x-request-id");
  // Only the API's own timeout is a WaitTimeout: a 504 from a proxy in between is that proxy giving up.
  if (response.status === 504 && error?.code === "timeout") {
    return new WaitTimeout(message, error.code, error.details ?? [], requestId);
  }
  return new MemstreamError(message, response.status, error?.code ?? null, error?.details ?? [], requestId);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class MemstreamClient {
  readonly url: string;
  private readonly headers: Record<string, string>;
  private readonly attempts: number;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.url = (options.url ?? process.env.MEMSTREAM_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    const key = options.apiKey ?? process.env.MEMSTREAM_API_KEY;
    this.headers = {
      "Content-Type": "application/json",
      Accept: "application/json",
      "User-Agent": `memstream-client-ts/${VERSION}`,
    };
    if (key) this.headers.Authorization = `Bearer ${key}`;
    this.attempts = Math.max(1, options.attempts ?? 5);
    this.baseDelayMs = options.baseDelayMs ?? 200;
    this.maxDelayMs = options.maxDelayMs ?? 10_000;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetchImpl = options.fetch ?? fetch;
  }

  private delay(retry: number, serverMs: number | null): number {
    const jitter = Math.random() * Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** retry);
    return serverMs === null ? jitter : Math.max(jitter, Math.min(serverMs, 300_000));
  }

  private async request<T>(method: string, path: string, ok: number[], attempt: () => Attempt): Promise<T> {
    for (let n = 0; ; n++) {
      const last = n === this.attempts - 1;
      const { body, timeoutMs } = attempt();
      let response: Response;
      try {
        response = await this.fetchImpl(this.url + path, {
          method,
          headers: this.headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(Math.ceil(timeoutMs)),
        });
      } catch (error) {
        if (last) throw new MemstreamError(`could not reach memstream at ${this.url}: ${String(error)}`, 0);
        await sleep(this.delay(n, null));
        continue;
      }
      if (RETRY_STATUSES.has(response.status) && !last) {
        await response.body?.cancel();
        await sleep(this.delay(n, retryAfterMs(response.headers.get("retry-after"))));
        continue;
      }
      const text = await response.text();
      let parsed: unknown = text;
      try {
        parsed = text ? JSON.parse(text) : null;
      } catch {
        // not JSON: something between us and memstream answered
      }
      if (ok.includes(response.status)) return parsed as T;
      throw errorOf(response, parsed, text);
    }
  }

  private send<T>(method: string, path: string, body: unknown, ok: number[]): Promise<T> {
    return this.request<T>(method, path, ok, () => ({ body, timeoutMs: this.timeoutMs }));
  }

  /** Publish turns; returns every item's fate and the positions to `wait` on. */
  async add(turns: TurnInput | TurnInput[]): Promise<EventsResult> {
    const events = (Array.isArray(turns) ? turns : [turns]).map((t) => ({
      type: "TurnRecorded",
      event_id: t.event_id ?? randomUUID(),
      session_id: t.session_id ?? "default",
      agent_id: t.agent_id ?? agentOf(t.speaker),
      turn_index: t.turn_index ?? 0,
      occurred_at: t.occurred_at ?? new Date().toISOString(),
      ...t,
    }));
    return this.send<EventsResult>("POST", "/v1/events", events, [200, 207]);
  }

  /**
   * Evidence for a question (zero LLM tokens), with provenance, best first. `options.max_turns` limits the
   * results (distinct turns); `options.k` only chooses how many units seed them as `primary` (see SearchOptions).
   */
  async search(question: string, options: SearchOptions = {}): Promise<SearchResponse> {
    return this.send<SearchResponse>("POST", "/v1/search", { ...options, question }, [200]);
  }

  /** Forget a conversation, session, turn (event_id) or agent; `wait(result.positions)` = complete. */
  async forget(scope: Partial<ForgetBody>): Promise<ForgetResult> {
    return this.send<ForgetResult>("POST", "/v1/forget", scope, [202]);
  }

  /**
   * Resolves true once every view has processed up to `positions` (read-your-writes); rejects with WaitTimeout
   * after `timeoutSeconds`. Each request's HTTP timeout is the time it waits plus the client's `timeoutMs`; a wait
   * longer than the API's 300 s per request is several requests.
   */
  async wait(positions: Positions, timeoutSeconds = 30): Promise<boolean> {
    if (!(timeoutSeconds >= 0)) throw new RangeError(`timeoutSeconds must be >= 0, not ${timeoutSeconds}`);
    const deadline = performance.now() + timeoutSeconds * 1000;
    const chunk = (): Attempt => {
      const seconds = Math.min(MAX_WAIT_SECONDS, Math.max(0, deadline - performance.now()) / 1000);
      return { body: { positions, timeout_seconds: seconds }, timeoutMs: seconds * 1000 + this.timeoutMs };
    };
    for (;;) {
      try {
        const result = await this.request<{ caught_up: boolean; reason?: string | null }>("POST", "/v1/wait", [200], chunk);
        if (result.caught_up) return true;
        // The server's answer to a wait that ran out (older servers answer 504 instead, handled in toError).
        throw new WaitTimeout(result.reason ?? "the views did not reach the positions in time", "timeout", [], null);
      } catch (error) {
        // A request that ran out before the wait's deadline was one chunk of a longer wait.
        if (!(error instanceof WaitTimeout) || deadline - performance.now() < 10) throw error;
      }
    }
  }
}
