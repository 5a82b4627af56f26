// The SSE parser against the WHATWG EventSource parsing rules.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SseParser } from '../eventrelay-client.js';

function parse(chunks) {
  const frames = [];
  const retries = [];
  const parser = new SseParser((f) => frames.push(f), (ms) => retries.push(ms));
  for (const chunk of chunks) parser.push(typeof chunk === 'string' ? new TextEncoder().encode(chunk) : chunk);
  return { frames, retries };
}

test('LF, CRLF and CR all end lines', () => {
  for (const eol of ['\n', '\r\n', '\r']) {
    const { frames } = parse([`id: 1${eol}event: a${eol}data: x${eol}${eol}`]);
    assert.deepEqual(frames, [{ id: '1', ownId: true, event: 'a', data: 'x' }], JSON.stringify(eol));
  }
});

test('a CRLF split across chunks is one line end', () => {
  const { frames } = parse(['data: a\r', '\ndata: b\r\n\r\n']);
  assert.deepEqual(frames, [{ id: undefined, ownId: false, event: 'message', data: 'a\nb' }]);
});

test('every split position of a stream gives the same frames', () => {
  const stream = 'retry: 10\r\n: comment\nid: 7\nevent: e\ndata: one\r\ndata:  two\r\rdata: three\n\n';
  const whole = parse([stream]);
  const bytes = new TextEncoder().encode(stream);
  for (let at = 0; at <= bytes.length; at++) {
    const split = parse([bytes.slice(0, at), bytes.slice(at)]);
    assert.deepEqual(split, whole, `split at ${at}`);
  }
  assert.deepEqual(whole.frames, [
    { id: '7', ownId: true, event: 'e', data: 'one\n two' },
    { id: '7', ownId: false, event: 'message', data: 'three' },
  ]);
  assert.deepEqual(whole.retries, [10]);
});

test('a leading BOM is dropped once', () => {
  // A second BOM is part of the next line, making its field unknown.
  const { frames } = parse(['\uFEFFdata: x\n\n\uFEFFdata: y\n\n']);
  assert.deepEqual(frames, [{ id: undefined, ownId: false, event: 'message', data: 'x' }]);
});

test('an id without data dispatches nothing but is kept for the next event', () => {
  const { frames } = parse(['id: 3\n\ndata: z\n\n']);
  assert.deepEqual(frames, [{ id: '3', ownId: false, event: 'message', data: 'z' }]);
});

test('comments, unknown fields and bad retry values are ignored', () => {
  const { frames, retries } = parse([': hb\n\nfoo: bar\nretry: 1x\nretry\ndata\n\n']);
  assert.deepEqual(frames, [{ id: undefined, ownId: false, event: 'message', data: '' }]);
  assert.deepEqual(retries, []);
});

test('an id containing NUL is ignored; one space after the colon is stripped', () => {
  const { frames } = parse(['id: 5\nid: a\0b\ndata:x\ndata:   y\n\n']);
  assert.deepEqual(frames, [{ id: '5', ownId: true, event: 'message', data: 'x\n  y' }]);
});

test('multi-byte characters split across chunks decode intact', () => {
  const bytes = new TextEncoder().encode('data: é✓\n\n');
  const { frames } = parse([bytes.slice(0, 7), bytes.slice(7)]);
  assert.equal(frames[0].data, 'é✓');
});

test('only a frame with its own id line reports ownId; an empty id counts, one with NUL does not', () => {
  const { frames } = parse(['id: 4\ndata: a\n\nevent: ready\ndata: b\n\nid\ndata: c\n\nid: x\0\ndata: d\n\n']);
  assert.deepEqual(
    frames.map((f) => [f.id, f.ownId, f.event]),
    [
      ['4', true, 'message'],
      ['4', false, 'ready'],
      ['', true, 'message'],
      ['', false, 'message'],
    ],
  );
});
