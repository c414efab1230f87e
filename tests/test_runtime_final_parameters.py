"""The end of a run says whether every rank holds the same model (a rank that missed a broadcast would not)."""
from geodiloco.runtime.train import report_final_parameters


def test_the_end_of_a_run_names_the_ranks_whose_parameters_differ(capsys):
    same = [{"node": "a", "local_rank": 0, "final_checksum": 812.5}, {"node": "a", "local_rank": 1, "final_checksum": 812.5},
            {"node": "b", "local_rank": 0, "final_checksum": 812.5}]
    report_final_parameters(same)
    assert capsys.readouterr().out == "[geodiloco] final parameter checksum 812.5 on every rank: a (2 ranks), b\n"
    report_final_parameters([*same[:2], {"node": "b", "local_rank": 0, "final_checksum": 812.50001}])
    err = capsys.readouterr().err
    assert err == ("[geodiloco] warning: the ranks ended on different parameters "
                   "(a rank 0 812.5, a rank 1 812.5, b rank 0 812.50001)\n")
