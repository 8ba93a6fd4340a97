// The reference scenario for k6: create a task, read its event stream to the end, think 1 s.
//
//   uv run k6 run -e BASE_URL=http://127.0.0.1:8000 -e API_KEY=bp_... -e AGENT_ID=... \
//       bench/k6/reference.js
//
// Environment:
//   BASE_URL        the server (default http://127.0.0.1:8000, what `make up` listens on)
//   API_KEY         a Bearer API key (`make up` prints one on first start)       [required]
//   AGENT_ID        the agent the tasks are for (`make up` prints the demo one) [required]
//   PEAK            virtual users at the hold (default 50)
//   RAMP_UP, HOLD, RAMP_DOWN   stage durations (default 30s, 75s, 30s): shorten for a quick run
//   THINK_S         seconds a user waits between tasks (default 1)
//   STREAM_TIMEOUT  how long one event stream may take (default 120s)
//
// k6 exits non-zero (99) when a threshold fails: any failed check or any failed HTTP request.
// docs/benchmarks/README.md, "Replaying the reference scenario with k6", says how to compare
// its figures with `bullpen bench`.
import http from 'k6/http';
import { check, fail, sleep } from 'k6';
import { Counter, Trend } from 'k6/metrics';

const BASE_URL = (__ENV.BASE_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const API_KEY = __ENV.API_KEY || '';
const AGENT_ID = __ENV.AGENT_ID || '';
const PEAK = parseInt(__ENV.PEAK || '50', 10);
const THINK_S = parseFloat(__ENV.THINK_S || '1');
const STREAM_TIMEOUT = __ENV.STREAM_TIMEOUT || '120s';

// Time from sending the create to its 201, and from sending the create to the stream's end
// (what `bullpen bench` reports as "create ms" and "completion ms").
const createTime = new Trend('bullpen_create', true);
const completionTime = new Trend('bullpen_completion', true);
const completed = new Counter('bullpen_tasks_done');

export const options = {
  scenarios: {
    reference: {
      executor: 'ramping-vus',
      startVUs: 0,
      stages: [
        { duration: __ENV.RAMP_UP || '30s', target: PEAK },
        { duration: __ENV.HOLD || '75s', target: PEAK },
        { duration: __ENV.RAMP_DOWN || '30s', target: 0 },
      ],
      // A user retired by the ramp-down finishes the task it is reading.
      gracefulRampDown: STREAM_TIMEOUT,
    },
  },
  thresholds: {
    checks: ['rate==1'],
    http_req_failed: ['rate==0'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

export function setup() {
  if (!API_KEY || !AGENT_ID) {
    fail('set API_KEY and AGENT_ID (make up prints both on first start)');
  }
  if (!(PEAK >= 1)) {
    fail(`PEAK must be a count >= 1, got ${__ENV.PEAK}`);
  }
}

let prompts = 0;

function prompt() {
  prompts += 1;
  return (
    'Analyze this dataset and extract key metrics: quarterly sales by region, columns ' +
    `region, quarter, units, revenue_usd. Report totals and outliers. VU ${__VU} #${prompts}.`
  );
}

export default function () {
  const auth = { Authorization: `Bearer ${API_KEY}` };
  const started = Date.now();
  const created = http.post(
    `${BASE_URL}/api/v1/tasks`,
    JSON.stringify({ prompt: prompt(), agent_id: AGENT_ID }),
    { headers: { ...auth, 'Content-Type': 'application/json' }, tags: { name: 'create' } },
  );
  const ok = check(created, { 'create answers 201': (r) => r.status === 201 });
  if (!ok) {
    sleep(THINK_S);
    return;
  }
  createTime.add(created.timings.duration);
  const taskId = created.json('id');
  // The server ends the stream after the task's `end` event (and a `close` marker), so the
  // body is read to its end.
  const stream = http.get(`${BASE_URL}/api/v1/tasks/${taskId}/events`, {
    headers: { ...auth, Accept: 'text/event-stream' },
    timeout: STREAM_TIMEOUT,
    tags: { name: 'events' },
  });
  const ended = check(stream, {
    'events answers 200': (r) => r.status === 200,
    'stream has the end event': (r) => typeof r.body === 'string' && r.body.includes('\nevent: end\n'),
    'the run ended done': (r) =>
      typeof r.body === 'string' && /\nevent: end\ndata: \{"status":"done"/.test(r.body),
  });
  if (ended) {
    completionTime.add(Date.now() - started);
    completed.add(1);
  }
  sleep(THINK_S);
}
