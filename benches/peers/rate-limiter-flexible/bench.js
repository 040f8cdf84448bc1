// rate-limiter-flexible (RateLimiterRedis: a fixed window, over ioredis)
// deciding against one Redis, as ratewall-redis's `loadgen` measures
// itself: N concurrent callers in one process, each deciding for a random
// identity out of 10 000 under a 100-per-minute limit, for SECS seconds
// per concurrency. Prints one JSON line per concurrency: decisions/s (a
// refusal is a decision) and p50/p99 latency in µs.
//
//   npm ci && node bench.js --url redis://127.0.0.1:6411/ --secs 3 --concurrency 1,16,50,64,256
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

function option(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
}

const url = option('url', process.env.REDIS_URL || 'redis://127.0.0.1:6379/');
const secs = Number(option('secs', '3'));
const levels = option('concurrency', '1,16,64,256').split(',').map(Number);
const IDENTITIES = 10000;

async function cell(limiter, concurrency) {
  const latencies = [];
  let decisions = 0;
  const until = process.hrtime.bigint() + BigInt(Math.round(secs * 1e9));
  async function caller() {
    while (process.hrtime.bigint() < until) {
      const key = `u${Math.floor(Math.random() * IDENTITIES)}`;
      const started = process.hrtime.bigint();
      try {
        await limiter.consume(key, 1);
      } catch (refused) {
        if (refused instanceof Error) throw refused;
      }
      latencies.push(Number(process.hrtime.bigint() - started) / 1000);
      decisions += 1;
    }
  }
  const began = process.hrtime.bigint();
  await Promise.all(Array.from({ length: concurrency }, caller));
  const elapsed = Number(process.hrtime.bigint() - began) / 1e9;
  latencies.sort((a, b) => a - b);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
  return { concurrency, decisions_per_sec: Math.round(decisions / elapsed), p50_us: Math.round(at(0.5)), p99_us: Math.round(at(0.99)) };
}

(async () => {
  const redis = new Redis(url, { enableOfflineQueue: true });
  const limiter = new RateLimiterRedis({ storeClient: redis, keyPrefix: 'rlf', points: 100, duration: 60 });
  for (const concurrency of levels) {
    console.log(JSON.stringify({ peer: 'rate-limiter-flexible', ...(await cell(limiter, concurrency)) }));
  }
  redis.disconnect();
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
