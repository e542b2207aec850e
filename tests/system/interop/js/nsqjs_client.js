'use strict'
// nsqjs against a broker, the way an application uses it; reports JSON lines on stdout like the
// Python client scripts in ../clients (bodies as Latin-1 text both ways).
//
//   node nsqjs_client.js publish '{"tcp": "127.0.0.1:4150", "ops": [...]}'
//     an nsq.Writer runs the ops in order: {"op": "pub", "topic", "body"} (PUB),
//     {"op": "mpub", "topic", "bodies"} (MPUB), {"op": "dpub", "topic", "defer_ms", "body"} (DPUB).
//
//   node nsqjs_client.js consume '{"tcp", "topic", "channels": [...], "expect": N, ...}'
//     one nsq.Reader per entry of channels; policy keys as in ../clients/behaviour.py (but
//     touch_every_ms);
//     optional max_in_flight, max_attempts, linger, deadline (seconds).
//
//   Both take "connection": options for every Writer/Reader (tls, tlsVerification, snappy,
//   deflate, deflateLevel, authSecret).

const nsq = require('nsqjs')

const EXIT_TIMEOUT = 3

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({event, ...fields}) + '\n')
}

const bodyBuffer = (text) => Buffer.from(text, 'latin1')
const bodyText = (buffer) => buffer.toString('latin1')

function splitAddress(address) {
  const at = address.lastIndexOf(':')
  return [address.slice(0, at), Number(address.slice(at + 1))]
}

function action(policy, attempts) {
  if (attempts < (policy.hold_below || 0)) return 'hold'
  if (attempts < (policy.requeue_below || 0)) return 'req'
  return 'fin'
}

function deadline(config) {
  setTimeout(() => {
    emit('timeout')
    process.exit(EXIT_TIMEOUT)
  }, (config.deadline || 20) * 1000)
}

async function publish(config) {
  const [host, port] = splitAddress(config.tcp)
  const writer = new nsq.Writer(host, port, config.connection || {})
  writer.on('error', (err) => emit('error', {error: String(err)}))
  await new Promise((resolve) => {
    writer.on('ready', resolve)
    writer.connect()
  })
  for (const op of config.ops) {
    const err = await new Promise((resolve) => {
      if (op.op === 'pub') writer.publish(op.topic, bodyBuffer(op.body), resolve)
      else if (op.op === 'mpub') writer.publish(op.topic, op.bodies.map(bodyBuffer), resolve)
      // nsqjs 0.13 takes the deferred message wrapped in a list, as its README shows.
      else if (op.op === 'dpub') writer.deferPublish(op.topic, [bodyBuffer(op.body)], op.defer_ms, resolve)
      else throw new Error(`unknown op ${op.op}`)
    })
    emit('published', {op: op.op, response: err ? `error: ${err}` : 'OK'})
  }
  writer.close()
  emit('done')
  process.exit(0)
}

function consume(config) {
  let finished = 0
  const held = []
  const readers = []
  const finish = () => {
    finished += 1
    if (finished === config.expect) {
      setTimeout(() => {
        readers.forEach((reader) => reader.close())
        emit('done', {finished})
        process.exit(0)
      }, (config.linger || 0) * 1000)
    }
  }
  config.channels.forEach((channel, index) => {
    const reader = new nsq.Reader(config.topic, channel, {
      nsqdTCPAddresses: [config.tcp],
      maxInFlight: config.max_in_flight || 1,
      maxAttempts: config.max_attempts || 0,
      requeueDelay: config.requeue_delay_ms || 0,
      // Keep the client's own backoff short: the tests observe the broker, not the pauses.
      maxBackoffDuration: 0.1,
      ...(config.connection || {}),
    })
    reader.on('ready', () => emit('subscribed', {reader: index, channel}))
    reader.on('error', (err) => emit('error', {reader: index, error: String(err)}))
    reader.on('discard', (msg) => {
      emit('giving_up', {reader: index, id: msg.id, attempts: msg.attempts})
      finish()
    })
    reader.on('message', (msg) => {
      const todo = action(config, msg.attempts)
      emit('message', {
        reader: index,
        channel,
        id: msg.id,
        body: bodyText(msg.body),
        attempts: msg.attempts,
        timestamp: msg.timestamp.toString(),
        received_ns: (BigInt(Date.now()) * 1000000n).toString(),
        action: todo,
      })
      if (todo === 'hold') {
        held.push(msg)
      } else if (todo === 'req') {
        msg.requeue(config.requeue_delay_ms || 0, false)
      } else if (config.finish_after_ms) {
        setTimeout(() => {
          msg.finish()
          finish()
        }, config.finish_after_ms)
      } else {
        msg.finish()
        finish()
      }
    })
    reader.connect()
    readers.push(reader)
  })
}

function main() {
  const [command, configText] = process.argv.slice(2)
  const config = JSON.parse(configText)
  deadline(config)
  if (command === 'publish') return publish(config)
  if (command === 'consume') return consume(config)
  throw new Error(`unknown command ${command}`)
}

main()
