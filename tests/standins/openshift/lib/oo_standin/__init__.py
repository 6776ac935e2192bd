"""A stand-in for an OpenShift v2 broker host, for gearshift's tests.

``oo-admin-ctl-district`` (ctl_district, district), ``oo-admin-move`` (move) and
the broker's default gear placement (placement) act on a JSON state file
(state) and on node roots laid out like ``/var/lib/openshift`` (node), enforcing
origin-server's rules with its messages and exit codes. ``oo-standin`` (admin)
sets the scene for a test. Python 3 standard library only.
"""
