"""What every refusal of hostile input on the command line looks like: exit 2, one line, no traceback."""


def assert_one_line_exit_2(code, err, *words):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
