"""Reporting on the running broker: one snapshot behind ``/stats`` and ``/metrics``.

* :mod:`~broker.observe.collect` -- :func:`snapshot`, one walk over topics, channels and clients
  (read through the structural types of :mod:`~broker.observe.sources`);
* :mod:`~broker.observe.stats` -- the frozen records a snapshot is made of;
* :mod:`~broker.observe.runtime` -- garbage-collection pauses and memory of the process;
* :mod:`~broker.observe.render_json` and :mod:`~broker.observe.render_text` -- ``/stats``;
* :mod:`~broker.observe.prometheus` -- ``/metrics`` (imported by the first scrape: it loads
  prometheus-client, which a start need not pay for);
* :mod:`~broker.observe.statsd_lines`, :mod:`~broker.observe.statsd_packets` and
  :mod:`~broker.observe.statsd_pusher` -- nsqd's statsd push (``--statsd-address``).

* :mod:`~broker.observe.health` -- the ``OK`` / ``NOK - <error>`` of ``/ping``;
* :mod:`~broker.observe.statsd_prefix` -- ``--statsd-prefix`` expanded at start.

Every renderer reads the same snapshot, so the numbers they show always agree. Import the
modules themselves: this package loads none of them, so that a start loads only ``health``,
``runtime`` and ``statsd_prefix``, and the records, renderers and pushers come with their
first use.
"""
