# Create the service user (broker package) and let systemd see the unit. The
# service is not started: configure /etc/gearshift first (keys, bus URL), then
# `systemctl enable --now @UNIT@`.
if [ -f /usr/lib/sysusers.d/gearshift.conf ]; then
    if [ -x /usr/bin/systemd-sysusers ]; then
        /usr/bin/systemd-sysusers /usr/lib/sysusers.d/gearshift.conf >/dev/null 2>&1 || :
    elif ! getent passwd gearshift >/dev/null 2>&1; then
        useradd -r -d /var/lib/gearshift-broker -s /usr/sbin/nologin -c "gearshift broker agent" gearshift >/dev/null 2>&1 || :
    fi
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    # First installation: apply the distribution's preset (enabled or not).
    if [ "$1" -eq 1 ]; then
        systemctl --no-reload preset @UNIT@ >/dev/null 2>&1 || :
    fi
fi
