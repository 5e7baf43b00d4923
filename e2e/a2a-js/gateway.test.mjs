// The A2A gateway from the official JavaScript SDK, @a2a-js/sdk: a real
// `a2a-bus serve --a2a-listen 127.0.0.1:0`, a2a-bus delegates that answer
// (`a2a-bus demo --hold`), and an unmodified SDK client.
//
// A2A_BUS_BINARY names the a2a-bus binary; without it the test builds one
// with `go build` from this checkout.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { Role, TaskState } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } from '@a2a-js/sdk/client';

const dir = mkdtempSync(join(tmpdir(), 'a2a-js-'));
let serve, demo, info;

// firstLine resolves with the first line a stream prints that matches.
function firstLine(stream, match = () => true) {
  return new Promise((res, rej) => {
    const rl = createInterface({ input: stream });
    rl.on('line', (line) => { if (match(line)) { res(line); } });
    rl.on('close', () => rej(new Error('the process ended before the line came')));
  });
}

function exited(p) {
  return p.exitCode !== null ? Promise.resolve() : new Promise((res) => p.once('exit', res));
}

before(async () => {
  let bin = process.env.A2A_BUS_BINARY;
  if (!bin) {
    bin = join(dir, 'a2a-bus');
    execFileSync('go', ['build', '-o', bin, './cmd/a2a-bus'], { cwd: resolve(import.meta.dirname, '../..'), stdio: 'inherit' });
  }
  const env = { ...process.env, XDG_RUNTIME_DIR: dir, XDG_STATE_HOME: dir, HOME: dir };
  serve = spawn(bin, ['serve', '--a2a-listen', '127.0.0.1:0', '--data-dir', '', '--connection-file', join(dir, 'connection.json'), '--log-level', 'warn'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  const path = await firstLine(serve.stderr);
  serve.stderr.resume();
  info = JSON.parse(readFileSync(path, 'utf8'));
  demo = spawn(bin, ['demo', '--connection-file', path, '--hold'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  await firstLine(demo.stdout, (l) => l.includes('holding the delegates'));
  demo.stdout.resume();
});

after(async () => {
  demo?.kill('SIGINT');
  if (demo) await exited(demo);
  serve?.kill('SIGTERM');
  if (serve) await exited(serve);
  rmSync(dir, { recursive: true, force: true });
});

// A fetch that carries the gateway's token, as an A2A client is
// configured to.
const withToken = (token) => (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('Authorization', `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};

function factory(token) {
  const fetchImpl = withToken(token);
  return new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
  }));
}

const cardURL = (agent) => `${info.a2aUrl}/agents/${agent}/.well-known/agent-card.json`;
const message = (text) => ({ messageId: crypto.randomUUID(), role: Role.ROLE_USER, parts: [{ content: { $case: 'text', value: text } }] });
const text = (part) => part.content?.$case === 'text' ? part.content.value : undefined;

test('a client of @a2a-js/sdk hands a delegate a task and sees it completed', async () => {
  const client = await factory(info.a2aToken).createFromUrl(cardURL('discussant'), '');
  const task = await client.sendMessage({ message: message('is seat 2 free?') });
  assert.equal(task.status.state, TaskState.TASK_STATE_COMPLETED, 'the send blocks until the task ends');
  assert.equal(text(task.status.message.parts[0]), 'discussant heard: is seat 2 free?');
  assert.equal(task.artifacts.length, 1);
  assert.equal(text(task.artifacts[0].parts[0]), 'is seat 2 free?');
  assert.equal(task.metadata.a2aBus.agentName, 'discussant');

  const got = await client.getTask({ id: task.id, historyLength: 1 });
  assert.equal(got.history.length, 1);
  const list = await client.listTasks({});
  assert.ok(list.tasks.some((t) => t.id === task.id));
  await assert.rejects(client.cancelTask({ id: task.id }), { name: 'TaskNotCancelableError' }, 'a task that ended cannot be canceled');
});

test('the stream sees the task, then each update in order', async () => {
  const client = await factory(info.a2aToken).createFromUrl(cardURL('discussant-2'), '');
  const seen = [];
  for await (const ev of client.sendMessageStream({ message: message('and seat 3?') })) {
    const { $case, value } = ev.payload;
    switch ($case) {
      case 'task': seen.push(`task:${TaskState[value.status.state]}`); break;
      case 'statusUpdate': seen.push(`status:${TaskState[value.status.state]}`); break;
      case 'artifactUpdate': seen.push(`artifact:${text(value.artifact.parts[0])}`); break;
      default: seen.push($case);
    }
  }
  assert.deepEqual(seen, ['task:TASK_STATE_SUBMITTED', 'status:TASK_STATE_WORKING', 'artifact:and seat 3?', 'status:TASK_STATE_COMPLETED']);
});

test('a wrong token is 401, an unknown agent 404', async () => {
  const bad = await fetch(`${info.a2aUrl}/agents`, { headers: { Authorization: 'Bearer wrong' } });
  assert.equal(bad.status, 401);
  await assert.rejects(factory('wrong').createFromUrl(cardURL('discussant'), ''), /401/);
  await assert.rejects(factory(info.a2aToken).createFromUrl(cardURL('nobody'), ''), /404/);
});
