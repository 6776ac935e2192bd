# On erase (not upgrade), stop and disable the service.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl --no-reload disable --now @UNIT@ >/dev/null 2>&1 || :
fi
