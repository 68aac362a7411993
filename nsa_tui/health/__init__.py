"""Is a run well, and if not, why: used by the host's watchdog and by the panel alike.

``alerts`` detects stalls and failures from the event stream (pure, a clock passed in), over
the facts it keeps per run and rank (``runfacts``) and the limits in ``thresholds``;
``ledger`` records alert transitions in a run's alerts.jsonl and reads them back;
``rootcause`` names the rank that failed first and why; ``stacks`` lays out a stack dump
for people; ``notify`` delivers alerts to a command or a webhook.
"""
