#!/bin/sh
# Stand-in for the mps-host bundle's launcher (hypha-accelerate-mps), for the host mode's
# mechanics. FAKE_MODE: sleep (exit 143 on SIGTERM), ignore (SIGTERM ignored, a child
# too), exit:CODE. The sleeping child shows whether the whole process group ends.
echo "args $*"
echo "venv $HYPHA_MPS_VENV"
echo "job_json ${JOB_JSON:-unset}"
echo "trust ${HYPHA_TRUST_REMOTE_CODE:-unset}"
printf 'bad \377 bytes\n'
case "$FAKE_MODE" in
    sleep)
        trap 'echo "got SIGTERM"; exit 143' TERM
        sleep 120 &
        echo "ready"
        wait
        ;;
    ignore)
        trap '' TERM
        sleep 120 &
        echo "ready"
        wait
        ;;
    exit:*)
        exit "${FAKE_MODE#exit:}"
        ;;
esac
