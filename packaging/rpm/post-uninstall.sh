# After an upgrade, restart the running service so the new binary is used.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart @UNIT@ >/dev/null 2>&1 || :
    fi
fi
