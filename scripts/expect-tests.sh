# Sourced by the stage scripts whose runs must not pass by running nothing:
#
#     cargo test ... 2>&1 | tee "$log"
#     expect_tests "$log" 3 "the weak-ordering models"
#
# Fails unless the `cargo test` output in the log reports exactly that many tests
# passed, over all its test binaries, and none failed.
expect_tests() {
    local log=$1 expected=$2 what=$3 passed failed
    passed=$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$log" |
        awk '{ n += $1 } END { print n + 0 }')
    failed=$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$log" |
        awk '{ n += $1 } END { print n + 0 }')
    if [[ $passed != "$expected" || $failed != 0 ]]; then
        echo "FAIL: ${what}: expected ${expected} tests to pass, ${passed} passed and ${failed} failed" >&2
        return 1
    fi
    echo "  ${what}: ${passed} of ${expected} tests ran and passed"
}
